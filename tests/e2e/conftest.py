"""The e2e tier: real sglang servers on CPU behind the sglang router (``./dev test-e2e`` provides them).

Outside the e2e venv (``./dev test``) every test here is skipped, with the command that runs it. With
``KVSTATUS_REQUIRE_E2E=1`` (set by ``./dev test-e2e``, so by CI) a missing piece fails the tier instead,
naming what is missing: never a silent skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

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
