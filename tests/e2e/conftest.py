"""The e2e tier: real sglang servers on CPU behind the sglang router (``./dev test-e2e`` provides them).

Outside the e2e venv (``./dev test``) every test here is skipped, with the command that runs it. With
``KVSTATUS_REQUIRE_E2E=1`` (set by ``./dev test-e2e``, so by CI) a missing piece fails the tier instead,
naming what is missing: never a silent skip.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.table import OUT, ROOT
from tests.helpers.tiers import require_redis_server
from tests.servers import RedisServer

MODEL_CACHE = Path(os.environ.get("KVSTATUS_E2E_MODEL", Path.home() / ".cache" / "kvstatus" / "e2e-model"))
REQUIRE = "KVSTATUS_REQUIRE_E2E"
NEEDED = {
    "sglang": "the real sglang package",
    "sglang_router": "the sglang-router wheel",
    "mooncake": "the mooncake-transfer-engine-non-cuda wheel",
    "uvicorn": "sglang's HTTP server dependencies",
}


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    """Skips (fails under KVSTATUS_REQUIRE_E2E=1) unless this interpreter has the e2e tier's packages."""
    missing = [f"{module} ({what})" for module, what in NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        message = "the e2e tier needs " + ", ".join(missing) + "; run ./dev test-e2e (it builds the venv)"
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def model() -> Path:
    """The tiny random-weight model, built once per version of tinymodel.py (in a subprocess: torch is big)."""
    digest = hashlib.sha256((Path(__file__).parent / "tinymodel.py").read_bytes()).hexdigest()[:12]
    directory = MODEL_CACHE / digest
    if not (directory / "model.safetensors").exists():
        subprocess.run(
            [sys.executable, "-m", "tests.e2e.tinymodel", str(directory)],
            cwd=ROOT,
            check=True,
            timeout=600,
            stdout=subprocess.DEVNULL,
        )
    return directory


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A redis-server of the module's own: each module's checks start from an empty server."""
    require_redis_server()
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="module")
def logs(request: pytest.FixtureRequest) -> Path:
    """The module's log directory: build/e2e/logs/<time>-<module>/<mode>/<role>-<port>.log (and, after a fault
    that left requests without an answer, the rooms as kvstatus saw them: :func:`tests.e2e.cluster.keep_rooms`)."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    directory = OUT / "logs" / f"{time.strftime('%Y%m%dT%H%M%S')}-{name}"
    directory.mkdir(parents=True)
    return directory
