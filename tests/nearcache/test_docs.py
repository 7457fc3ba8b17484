"""The code blocks of docs/nearcache-readme-section.md run as written (against a test server's URL)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvstatus import StatusStore
from kvstatus.admin.acl import acl_setuser_line
from kvstatus.demo.server import RedisServer

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "nearcache-readme-section.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.real
@pytest.mark.parametrize("index", range(len(_blocks())))
def test_code_block_runs(index: int, redis_server: RedisServer) -> None:
    code = _blocks()[index].replace("redis://localhost:6379/0", redis_server.url)
    with StatusStore.from_url(redis_server.url, namespace="prod-a") as admin:
        admin.client.delete(*(admin.keys.room_key(r) for r in (7, 42, 43)))
    exec(compile(code, f"{DOC.name} block {index}", "exec"), {})


def test_acl_lines_are_the_library_recipe() -> None:
    text = DOC.read_text(encoding="utf-8")
    for read_only, user in ((False, "prefill-prod-a"), (True, "dashboard-prod-a")):
        assert acl_setuser_line(user, "prod-a", read_only=read_only) in text
