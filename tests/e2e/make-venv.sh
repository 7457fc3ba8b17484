#!/usr/bin/env bash
# The virtualenv of the end-to-end tier (`./dev test-e2e`): real sglang==0.5.23 *servers* on CPU (a prefill
# and a decode, KV moved by mooncake over TCP) behind the sglang-router, plus this checkout of kvstatus.
#
# Usage: bash tests/e2e/make-venv.sh [VENV]   (default ~/.cache/kvstatus/e2e-venv, outside the repo)
#
# Built on top of the real-sglang tier's venv recipe (tests/sglang/make-venv.sh: sglang --no-deps on CPU
# torch 2.13.0, kvstatus editable), then the server side that recipe leaves out. Cold: ~5 min and ~3 GB;
# warm: ~15 s (the sglang tier's import probe, then the stamp below).
#
# What it needs beyond PyPI, and why:
#  * Debian's libibverbs1, libnl-3-200 and libnl-route-3-200: the mooncake-transfer-engine-non-cuda wheel
#    links against them even when it only uses TCP (no RDMA hardware needed). Installed with apt-get when
#    missing and we are root; otherwise this script stops and names them.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${1:-$HOME/.cache/kvstatus/e2e-venv}"
PIP=("$VENV/bin/pip" install --disable-pip-version-check -q)
DEBS=(libibverbs1 libnl-3-200 libnl-route-3-200)

missing=()
for deb in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "install ok installed" || missing+=("$deb")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "make-venv(e2e): installing Debian packages ${missing[*]} (mooncake's transfer engine links them)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "make-venv(e2e): missing Debian packages ${missing[*]}: mooncake-transfer-engine-non-cuda links" \
             "against them. Install them (apt-get install ${missing[*]}) and run again." >&2
        exit 1
    fi
fi

# 1. sglang on CPU torch + kvstatus editable + the test dependencies: the sglang tier's recipe, reused.
bash "$REPO/tests/sglang/make-venv.sh" "$VENV"

# 2. What `python -m sglang.launch_server` imports beyond the sglang tier's import chain (HTTP server,
#    grammar backends, OpenAI-compatible API), the transfer engine and the router. All pinned, installed with
#    their dependencies: none of them replaces torch (the probe below asserts it is still the CPU build).
SERVER_PINS=(
    uvicorn==0.54.0 fastapi==0.163.2 uvloop==0.23.0 python-multipart==0.0.34 setproctitle==1.3.8
    psutil==7.2.2 openai==2.8.0 openai-harmony==0.0.4 interegular==0.3.3 llguidance==1.9.1
    partial-json-parser==0.2.1.1.post7 einops==0.8.2 xxhash==4.1.0 scipy==1.17.1 tiktoken==0.14.0
    distro==1.9.0 easydict==1.14 'python-dateutil==2.9.0.post0' regex==2026.11.19 zstandard==0.25.0
    watchfiles==1.3.0 jsonschema==4.26.0 xgrammar==0.2.7 soundfile==0.13.1
    mooncake-transfer-engine-non-cuda==0.3.13.post1 sglang-router==0.3.2
)
STAMP="$VENV/.e2e-server-pins"
WANT="${SERVER_PINS[*]}"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "make-venv(e2e): installing the sglang server, mooncake and router packages into $VENV" >&2
    # pip warns "sglang 0.5.23 requires X, which is not installed" (its GPU tree): expected, as in the sglang tier
    "${PIP[@]}" "${SERVER_PINS[@]}" 2>&1 | grep -v -e "^WARNING: Location" -e "sglang 0.5.23 requires" \
        -e "dependency resolver does not currently" >&2 || true
    (cd / && SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$REPO/tests/e2e/cpu_path" "$VENV/bin/python" -W ignore -c \
        'import sglang.srt.entrypoints.http_server, mooncake.engine, sglang_router, torch; assert torch.__version__.endswith("+cpu"), torch.__version__')
    echo "$WANT" > "$STAMP"
fi
