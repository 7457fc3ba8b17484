"""The board in a real browser: Debian's headless Chromium driven by selenium through /usr/bin/chromedriver.

No browser is downloaded: selenium is pointed at the system chromium and
chromedriver (Debian packages ``chromium`` and ``chromium-driver``). Without
them the test skips saying so; with CI=true it fails. Set
KVSTATUS_BOARD_SCREENSHOT=path to keep the screenshot (docs/board.png is made so).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.keys import FATE_FIELD, KeySchema
from tests.helpers.backends import fresh_namespace
from tests.helpers.tiers import real_redis_required
from tests.observe.support import ServerProcess, wait_until
from tests.observe.test_board_timeline import walk_room, write_stuck_rooms
from tests.servers import RedisServer

pytestmark = pytest.mark.real

TIMED_ROOM = 7000
HOSTILE_ROOM = 4242
HOSTILE_ORIGIN = "<img src=x onerror=window.pwned=1>"  # no colon: a valid record's origin, written raw
HOSTILE_REASON = "<script>window.pwned=2</script></span><b>bold</b> & \"quoted\" 'too'"
CHROMIUM = ("/usr/bin/chromium", "chromium")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromium-driver")


def _find(path: str, name: str) -> str:
    found = path if os.access(path, os.X_OK) else shutil.which(Path(path).name)
    if found is None:
        message = (
            f"{Path(path).name} is not installed, so the board's browser test cannot run "
            f"(Debian: apt-get install {name})"
        )
        if real_redis_required():
            pytest.fail(message + "; CI requires it", pytrace=False)
        pytest.skip(message)
    return found


@pytest.fixture
def browser() -> Iterator[object]:
    chromium, chromedriver = _find(*CHROMIUM), _find(*CHROMEDRIVER)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if real_redis_required():
            pytest.fail("selenium is not installed (./dev test installs it); CI requires it", pytrace=False)
        pytest.skip("selenium is not installed (./dev test installs it)")
    profile = tempfile.mkdtemp(prefix="kvstatus-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1200,780",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def populate(url: str, namespace: str) -> dict[str, int]:
    """A small PD cluster's rooms, written through the library; returns the expected entries by status."""
    plan = {"prefill-0": range(0, 40), "prefill-1": range(40, 80), "decode-0": range(0, 80)}
    for participant, rooms in plan.items():
        with StatusStore.from_url(url, namespace=namespace, participant=participant) as store:
            store.update_many({room: KVPoll(1 + room % 4) for room in rooms})
            if participant == "decode-0":
                store.update_many({room: KVPoll.Failed for room in range(3, 80, 10)})
                store.record_failure(3, "decode-0: KV transfer timed out after 300 s")
    with StatusStore.from_url(url, namespace=namespace) as store:  # the entries as their reads answer (shared fate)
        counts = {s.name: 0 for s in KVPoll}
        for participant in plan:
            for status in store.for_participant(participant).get_many(range(80)).values():
                if status is not None:
                    counts[status.name] += 1
    return counts


def test_board_renders_counts_and_a_rooms_detail_in_chromium(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with RedisServer() as redis_server:  # its own server: the screenshot shows this namespace alone
        _render_and_check(browser, redis_server, tmp_path, By)


def _render_and_check(browser: Any, redis_server: RedisServer, tmp_path: Path, By: Any) -> None:

    namespace = fresh_namespace("browser")
    expected = populate(redis_server.url, namespace)
    with ServerProcess(
        "--url", redis_server.url, "--namespace", namespace, "serve", "--port", "0", "--interval", "0.5"
    ) as server:
        browser.get(server.base + "/")
        text = lambda element_id: browser.find_element(By.ID, element_id).text
        wait_until(lambda: text("count-rooms") == "80", 30, "the rendered room count")
        assert text("namespace") == namespace
        for status, count in expected.items():
            assert text(f"count-{status}") == str(count), status
        assert text("count-nottl") == "0"
        lines = browser.find_elements(By.CSS_SELECTOR, "#chart polyline")
        assert len(lines) == 5
        strokes = {line.get_attribute("data-status"): line.value_of_css_property("stroke") for line in lines}
        assert strokes["Failed"] == "rgb(214, 69, 69)" and len(set(strokes.values())) == 5, strokes

        with StatusStore.from_url(redis_server.url, namespace=namespace, participant="prefill-0") as store:
            for step in range(3):  # the cluster moves on: the chart and the live changes follow
                store.update_many({room: KVPoll.Success for room in range(step * 12, step * 12 + 12)})
                store.update_many({room: KVPoll.Bootstrapping for room in range(100 + step * 15, 115 + step * 15)})
                shown = len(browser.find_elements(By.CSS_SELECTOR, "#changes div a"))
                wait_until(
                    lambda: len(browser.find_elements(By.CSS_SELECTOR, "#changes div a")) > shown,  # noqa: B023 - used at once, in this iteration
                    30,
                    "the change to show up",
                )
        wait_until(lambda: text("count-rooms") == "125", 30, "the new rooms counted")
        changes = text("changes")
        assert "new room 114" in changes and "advanced room 0" in changes, changes

        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.room[data-room='3']"), 30, "the rooms table")
        browser.find_element(By.CSS_SELECTOR, "tr.room[data-room='3']").click()
        wait_until(lambda: text("detail").startswith("room 3"), 30, "room 3's detail")
        detail = text("detail")
        for line in ("prefill-0 Success -", "decode-0 Failed decode-0: KV transfer timed out after 300 s"):
            assert line in detail, detail
        assert "prefill-1" not in detail
        assert text("detail-failure-stage") == "transfer" and text("detail-failure-origin") == "decode-0"
        assert text("detail-failure-reason") == "decode-0: KV transfer timed out after 300 s"
        ttl = float(text("detail-ttl").split()[0])
        assert 500 < ttl <= 600

        browser.execute_script(
            "document.getElementById('f-status').value = 'Failed';"
            "document.getElementById('f-participant').value = 'decode-0';"
        )
        browser.find_element(By.ID, "apply").click()
        wait_until(
            lambda: (
                {e.get_attribute("data-room") for e in browser.find_elements(By.CSS_SELECTOR, "tr.room")}
                == {str(r) for r in range(3, 80, 10)}
            ),
            30,
            "the Failed rooms of decode-0",
        )

        shot = Path(os.environ.get("KVSTATUS_BOARD_SCREENSHOT") or tmp_path / "board.png")
        browser.execute_script("location.hash = 'room=3'")
        wait_until(lambda: text("detail").startswith("room 3"), 10, "the detail again")
        browser.execute_script("window.scrollTo(0, 0)")
        assert browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        # A tenant's text in a room's first failure is shown as text, never run (no stored XSS).
        key = f"kvstatus:{namespace}:{{{HOSTILE_ROOM}}}"
        raw = redis_server.client()
        raw.hset(
            key, mapping={"prefill-0": "0", FATE_FIELD: f"1700000000000:cancelled:{HOSTILE_ORIGIN}:{HOSTILE_REASON}"}
        )
        raw.pexpire(key, 600_000)
        browser.execute_script(f"location.hash = 'room={HOSTILE_ROOM}'")
        wait_until(lambda: text("detail").startswith(f"room {HOSTILE_ROOM}"), 10, "the hostile room's detail")
        assert text("detail-failure-origin") == HOSTILE_ORIGIN and text("detail-failure-reason") == HOSTILE_REASON
        assert text("detail-failure-stage") == "cancelled"
        assert not browser.find_elements(By.CSS_SELECTOR, "#detail img, #detail script, #detail-failure-reason b")
        assert browser.execute_script("return window.pwned === undefined")

        _check_timeline_and_stuck(browser, redis_server, namespace, text, By)
        assert server.terminate() == 0


def _check_timeline_and_stuck(browser: Any, redis_server: RedisServer, namespace: str, text: Any, By: Any) -> None:
    """The room detail draws one bar per participant from its timeline; the stuck view lists the stuck rooms."""
    walk_room(redis_server.url, namespace, TIMED_ROOM, pause=0)
    # Times written by hand, so that the widths below do not depend on how fast a loaded box ran the walk.
    key, now = KeySchema(namespace).room_key(TIMED_ROOM), int(redis_server.client().time()[0]) * 1000
    redis_server.client().hset(
        key,
        mapping={"t:prefill-0": f"1@{now - 1000} 2+200 3+600 4+800", "t:decode-tp0-pp0": f"1@{now - 900} 2+500 3+700"},
    )
    with StatusStore.from_url(redis_server.url, namespace=namespace) as store:
        timelines = store.room(TIMED_ROOM).timelines
    start = min(steps[0].at_ms for steps in timelines.values())
    browser.execute_script(f"location.hash = 'room={TIMED_ROOM}'")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#detail-timeline .tl-row"), 10, "the timeline bars")
    rows = browser.find_elements(By.CSS_SELECTOR, "#detail-timeline .tl-row")
    assert [row.get_attribute("data-participant") for row in rows] == ["decode-tp0-pp0", "prefill-0"]
    for row in rows:
        name = row.get_attribute("data-participant")
        segments = row.find_elements(By.CSS_SELECTOR, ".seg")
        steps = timelines[name]
        assert [s.get_attribute("data-status") for s in segments] == [step.status.name for step in steps]
        assert [int(s.get_attribute("data-from-ms")) for s in segments] == [step.at_ms - start for step in steps]
        assert segments[0].text.startswith(steps[0].status.name)  # labelled
        colours = {s.get_attribute("data-status"): s.value_of_css_property("background-color") for s in segments}
        assert colours.get("Success", "rgba(46, 158, 91, 1)") == "rgba(46, 158, 91, 1)"  # the status colours
        assert len(set(colours.values())) == len(segments)
    # Widths are proportional to the time spent: prefill-0 waited twice as long as it bootstrapped.
    prefill = {s.get_attribute("data-status"): s for s in rows[1].find_elements(By.CSS_SELECTOR, ".seg")}
    bar = rows[1].find_element(By.CSS_SELECTOR, ".tl-bar").size["width"]
    end_ms = max(int(s.get_attribute("data-to-ms")) for row in rows for s in row.find_elements(By.CSS_SELECTOR, ".seg"))
    for status in ("Bootstrapping", "WaitingForInput", "Transferring"):
        segment = prefill[status]
        ms = int(segment.get_attribute("data-to-ms")) - int(segment.get_attribute("data-from-ms"))
        assert abs(segment.size["width"] - bar * ms / end_ms) <= 2, (status, segment.size, bar, ms, end_ms)
    assert prefill["WaitingForInput"].size["width"] > 1.5 * prefill["Bootstrapping"].size["width"]
    running = rows[0].find_elements(By.CSS_SELECTOR, ".seg.running")  # decode-tp0-pp0 is still Transferring
    assert [s.get_attribute("data-status") for s in running] == ["Transferring"] and "so far" in running[0].text
    assert text("detail-timeline-end").startswith("+")

    expected = write_stuck_rooms(redis_server.client(), namespace)
    browser.execute_script("document.getElementById('stuck-older').value = '60'")
    browser.find_element(By.ID, "stuck-find").click()
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#stuck tr.room")) == 2, 30, "the stuck rooms")
    listed = browser.find_elements(By.CSS_SELECTOR, "#stuck tr.room")
    assert [r.get_attribute("data-room") for r in listed] == ["9101", "9100"]
    for row in listed:
        holder, status, at_least = expected[int(row.get_attribute("data-room"))]
        assert row.find_element(By.CSS_SELECTOR, ".stuck-holder").text == holder
        assert (status or "no entry") in row.text
        assert at_least <= float(row.find_element(By.CSS_SELECTOR, ".stuck-seconds").text.split()[0]) < at_least + 60
    assert "no progress for more than 60 s" in text("stuck-note")
    listed[0].click()  # a stuck room opens its detail, bars included
    wait_until(lambda: text("detail").startswith("room 9101"), 10, "the stuck room's detail")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#detail-timeline .tl-row")) == 2


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(float(part)) for part in css[css.index("(") + 1 : css.index(")")].split(",")[:3])


def test_pair_matrix_in_chromium(browser: Any, redis_server: RedisServer) -> None:
    """Rows are prefill instances, columns decode instances; each cell shows the pair's counts, coloured from
    green (only successes) to red (failures or stuck rooms, no success); no room: an empty cell."""
    from selenium.webdriver.common.by import By

    from tests.admin.test_health import build, stores, succeed
    from tests.helpers.backends import RedisUnderTest

    backend = RedisUnderTest("real", redis_server.client(), redis_server.client, False)
    try:
        build(backend)  # a-b: 2 succeeded, 1 failed; c-d: 2 failed, 1 stuck; e-(none): 1 stuck
        succeed(50, *stores(backend, "prefill-a-tp0-pp0", "decode-d-tp0-pp0"))  # a-d: only successes
        with ServerProcess(
            "--url", redis_server.url, "--namespace", backend.namespace, "serve", "--port", "0", "--interval", "0.5"
        ) as server:
            browser.get(server.base + "/")
            wait_until(lambda: "whole namespace" in browser.find_element(By.ID, "pairs-note").text, 30, "the pairs")
            heads = browser.find_elements(By.CSS_SELECTOR, "#pairs-matrix thead th[data-decode]")
            assert [h.get_attribute("data-decode") for h in heads] == ["decode-b", "decode-d", "(none)"]
            rows = browser.find_elements(By.CSS_SELECTOR, "#pairs-matrix tbody tr")
            assert [r.get_attribute("data-prefill") for r in rows] == ["prefill-a", "prefill-c", "prefill-e"]
            cells = {
                (c.get_attribute("data-prefill"), c.get_attribute("data-decode")): c
                for c in browser.find_elements(By.CSS_SELECTOR, "#pairs-matrix td")
            }
            assert len(cells) == 9
            filled = {key for key, c in cells.items() if "pair-empty" not in (c.get_attribute("class") or "")}
            assert filled == {
                ("prefill-a", "decode-b"),
                ("prefill-a", "decode-d"),
                ("prefill-c", "decode-d"),
                ("prefill-e", "(none)"),
            }
            for key in set(cells) - filled:
                assert cells[key].text == "", key  # no room: an empty cell
            counts = {
                key: tuple(int(cells[key].get_attribute(f"data-{n}")) for n in ("succeeded", "failed", "stuck"))
                for key in filled
            }
            assert counts == {
                ("prefill-a", "decode-b"): (2, 1, 0),
                ("prefill-a", "decode-d"): (1, 0, 0),
                ("prefill-c", "decode-d"): (0, 2, 1),
                ("prefill-e", "(none)"): (0, 0, 1),
            }
            assert (
                "2 ok" in cells[("prefill-a", "decode-b")].text and "1 failed" in cells[("prefill-a", "decode-b")].text
            )
            assert (
                "2 failed" in cells[("prefill-c", "decode-d")].text
                and "1 stuck" in cells[("prefill-c", "decode-d")].text
            )
            assert "UNHEALTHY" in cells[("prefill-c", "decode-d")].text
            verdicts = {key: cells[key].get_attribute("data-verdict") for key in filled}
            assert {k for k, v in verdicts.items() if v == "UNHEALTHY"} == {
                ("prefill-c", "decode-d"),
                ("prefill-e", "(none)"),
            }
            colour = {key: _rgb(cells[key].value_of_css_property("background-color")) for key in filled}
            green, mixed, red = (
                colour[("prefill-a", "decode-d")],
                colour[("prefill-a", "decode-b")],
                colour[("prefill-c", "decode-d")],
            )
            assert green[1] > 150 and green[0] < 60 and green[2] < 60, green  # only successes: green
            assert red[0] > 150 and red[1] < 60 and red[2] < 60, red  # failures and stuck, no success: red
            assert colour[("prefill-e", "(none)")] == red
            assert green[0] < mixed[0] < red[0] and mixed[1] > red[1], mixed  # 2 of 3 succeeded: in between
            assert (
                "unhealthy: prefill-c,decode-d; prefill-e,(none)" in browser.find_element(By.ID, "pairs-unhealthy").text
            )
            legend = browser.find_element(By.ID, "pairs-legend").text
            assert "only successes" in legend and "no room" in legend and "UNHEALTHY" in legend
            note = browser.find_element(By.ID, "pairs-note").text
            assert note.startswith("4 pairs, 2 unhealthy") and "9 rooms read" in note, note

            browser.execute_script("document.getElementById('pairs-threshold').value = '4'")
            browser.find_element(By.ID, "pairs-judge").click()  # a higher threshold: no pair is unhealthy
            wait_until(
                lambda: (
                    not browser.find_elements(By.CSS_SELECTOR, "#pairs-matrix td.unhealthy")
                    and browser.find_element(By.ID, "pairs-note").text.startswith("4 pairs, 0 unhealthy")
                ),
                30,
                "the matrix judged again",
            )
            browser.execute_script("document.getElementById('pairs-window').value = '90'")
            browser.find_element(By.ID, "pairs-judge").click()  # above the tombstone TTL: the board says why
            wait_until(lambda: "at most the tombstone TTL" in browser.find_element(By.ID, "pairs-note").text, 30, "400")
            assert server.terminate() == 0
            assert "Traceback" not in server.output
    finally:
        backend.close()
