"""Issue 19 item 10: every numeric URL option out of range is a usage error naming the option (exit 2), never an
OverflowError from the socket layer or the backoff arithmetic (exit 1 with a Python message)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvstatus import AsyncStatusStore, StatusStore
from kvstatus.errors import InvalidArgumentError, InvalidURLError
from kvstatus.url import MAX_DB, ConnectionOptions
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT_ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}

# Each value raised OverflowError (or reached Redis as a nonsense SELECT) before the fix.
OUT_OF_RANGE = [
    ("socket_timeout", "1e300"),
    ("socket_timeout", "1e20"),
    ("socket_connect_timeout", "1e300"),
    ("deadline", "1e300"),
    ("retries", "1024"),
    ("retries", "100000000000000000000"),
    ("max_connections", "100000000000000000000"),
    ("db", str(MAX_DB + 1)),
]


@pytest.mark.real
@pytest.mark.parametrize("option, value", OUT_OF_RANGE)
def test_out_of_range_url_option_exits_2_naming_it(real_server: RedisServer, option: str, value: str) -> None:
    url = f"redis://{real_server.host}:{real_server.port}/0?{option}={value}"
    script = f"set -e\nkvstatus --url '{url}' --namespace ns get 1\necho reached-the-end"
    done = subprocess.run(["bash", "-c", script], env=CHECKOUT_ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "reached-the-end" not in done.stdout
    assert "Traceback" not in done.stderr and "OverflowError" not in done.stderr
    assert option in done.stderr.replace("database", "db"), done.stderr


@pytest.mark.parametrize("option, value", [o for o in OUT_OF_RANGE if o[0] != "db"])
def test_out_of_range_options_are_refused_by_the_library_sync_and_async(option: str, value: str) -> None:
    url = f"redis://127.0.0.1:1/0?{option}={value}"
    for make in (StatusStore.from_url, AsyncStatusStore.from_url):
        with pytest.raises(InvalidURLError, match=f"invalid {option} "):
            make(url, namespace="ns")
    number = float(value) if "." in value or "e" in value else int(value)
    with pytest.raises(InvalidArgumentError, match=f"invalid {option} .*<= "):
        ConnectionOptions(**{option: number})


def test_the_largest_accepted_values_still_build_a_client() -> None:
    top = ConnectionOptions(
        socket_timeout=86_400,
        socket_connect_timeout=86_400,
        deadline=86_400,
        retries=100,
    )
    assert top.retry_budget() == pytest.approx(3.1 + 95 * 2.0)  # 0.1 ... 1.6, then 2 s each: it stays finite
    StatusStore.from_url(f"redis://127.0.0.1:1/{MAX_DB}?retries=100&socket_timeout=86400", namespace="ns")
