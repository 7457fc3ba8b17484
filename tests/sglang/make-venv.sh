#!/usr/bin/env bash
# The virtualenv of the optional real-sglang test tier (`./dev test-sglang`): the real sglang==0.5.23 on
# CPU-only torch, enough for `from sglang.srt.disaggregation.common.conn import CommonKVManager` without
# GPUs, plus this checkout of kvstatus (editable, --no-deps) and the test dependencies.
#
# Usage: bash tests/sglang/make-venv.sh [VENV]   (default ~/.cache/kvstatus/sglang-venv, outside the repo)
#
# Cold: ~2 min and 2.2 GB (unpacking torch and triton). Warm: the sglang part is skipped when the venv
# already imports CommonKVManager (that probe alone takes ~10 s: sglang's import chain is heavy), and
# kvstatus is reinstalled only when the checkout or its pyproject.toml changed.
#
# Why the order and the --no-deps:
#  * sglang 0.5.23 pins torch==2.14.1, a CUDA build pulling ~3 GB of nvidia-* wheels. So sglang goes in
#    with --no-deps, and torch==2.13.0 first, which pip resolves to the CPU wheel 2.13.0+cpu.
#  * torchvision must be 0.28.0 (the release pinned to torch 2.13.0) and --no-deps, or pip "upgrades"
#    torch to the CUDA 2.14.1 build. Same for triton and compressed-tensors.
#  * PyPI's torchvision is a CUDA build whose _C.so cannot load on CPU torch; step 5 guards the two
#    fake-kernel registrations that then fail ("operator torchvision::nms does not exist").
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${1:-$HOME/.cache/kvstatus/sglang-venv}"
PROBE='from sglang.srt.disaggregation.common.conn import CommonKVManager'
PIP=("$VENV/bin/pip" install --disable-pip-version-check -q)

# pip reports "sglang 0.5.23 requires X, which is not installed" (and its unmet torch pin) after each step,
# about 200 lines under an "ERROR: pip's dependency resolver" header: expected, as only what the import chain
# needs goes in, on CPU torch. Those lines are left out (and the index's "WARNING: Location" notes); any other
# conflict is shown, and a failing pip still fails the script (pipefail).
pip_install() {
    "${PIP[@]}" "$@" 2>&1 | { grep -v -e "^WARNING: Location" -e "dependency resolver does not currently" \
        -e ", which is not installed\.$" -e "^sglang 0\.5\.23 requires .* which is incompatible\.$" || true; } >&2
}

if [ -x "$VENV/bin/python" ] && (cd / && "$VENV/bin/python" -W ignore -c "$PROBE") >/dev/null 2>&1; then
    echo "make-venv: sglang already importable in $VENV" >&2
else
    echo "make-venv: building $VENV (real sglang on CPU torch; ~2 min, ~2.2 GB)" >&2
    python3 -m venv "$VENV"
    # 1. sglang itself, without its (GPU) dependency tree
    pip_install --no-deps sglang==0.5.23
    # 2. CPU torch + numpy
    pip_install torch==2.13.0 numpy
    # 3. torch-adjacent packages, pinned and --no-deps so torch is never replaced
    pip_install --no-deps torchvision==0.28.0 triton==3.7.1 compressed-tensors==0.18.0
    pip_install loguru
    # 4. the pure-Python modules the import chain asks for, one missing module at a time;
    #    prometheus-client makes the mooncake and ascend backends importable too
    pip_install msgspec pyzmq aiohttp requests pillow pyyaml protobuf \
        apache-tvm-ffi==0.1.11 ipython orjson pybase64 packaging starlette \
        pydantic tqdm transformers==5.19.0 tokenizers==0.23.2 dill sentencepiece==0.2.1 gguf \
        'prometheus-client>=0.20.0'
    # 5. guard torchvision's nms/qnms fake-kernel registrations with _has_ops() (idempotent, in the venv only)
    TV_META="$("$VENV/bin/python" -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
    sed -i -E 's/^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))  # kvstatus CPU patch/' "$TV_META"
    (cd / && "$VENV/bin/python" -W ignore -c "$PROBE; import torch; assert not torch.cuda.is_available()")
fi

# kvstatus from this checkout (editable: the sglang plugin entry point is registered) + the test deps.
STAMP="$VENV/.kvstatus-checkout"
WANT="$REPO $(stat -c %Y "$REPO/pyproject.toml")"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "make-venv: installing kvstatus from $REPO into $VENV" >&2
    pip_install 'redis[hiredis]>=5.0' 'click>=8.1' 'fakeredis[lua]>=2.26' 'hypothesis>=6.100' 'pytest>=8' \
        'pytest-asyncio>=0.24' 'pytest-timeout>=2.3' hatchling editables
    pip_install --no-deps --no-build-isolation -e "$REPO"
    echo "$WANT" > "$STAMP"
fi
