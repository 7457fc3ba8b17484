"""`kvstatus exporter` as an operator runs it: a subprocess scraped over HTTP, against real redis-servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import redis

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.reads import iter_rooms
from kvstatus.keys import KeySchema
from kvstatus.model import Stage
from kvstatus.observe.exporter import METRICS
from tests.helpers.backends import fresh_namespace
from tests.observe.support import ServerProcess, sample, scrape, wait_until
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.real

PASSWORD = "exporter-s3cret-pw"


def stats_json(url: str, namespace: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}
    done = subprocess.run(
        [sys.executable, "-m", "kvstatus.cli", "--url", url, "--namespace", namespace, "stats", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    report = json.loads(done.stdout)
    assert done.returncode == (3 if report["findings"] else 0), done.stderr  # 3: stats found leaks or corruption
    return report


def first_failures(url: str, namespace: str) -> Counter:
    """The rooms whose first failure is recorded, by stage, as the rooms' views say (corrupted rooms skipped)."""
    client = redis.Redis.from_url(url)
    try:
        views = iter_rooms(client, KeySchema(namespace), on_corrupt=lambda *_: None)
        return Counter(v.failure.stage.value for v in views if v.failure is not None)
    finally:
        client.close()


def populate(url: str, namespace: str, rooms: int) -> None:
    """Rooms of three participants in every status, short-TTL stragglers, a leaked key and a corrupted room."""
    participants = ["prefill-0", "prefill-1", "decode-0"]
    stores = [StatusStore.from_url(url, namespace=namespace, participant=p) for p in participants]
    for i, store in enumerate(stores):
        store.update_many({room: KVPoll(1 + (room + i) % 4) for room in range(i * 7, rooms)})
        store.update_many({room: KVPoll.Failed for room in range(i * 7, rooms, 11)})
        store.record_failure(i * 7, "transfer timed out")
    straggler = StatusStore.from_url(url, namespace=namespace, participant="decode-1", ttl=40)
    straggler.update_many({room: KVPoll.Transferring for room in range(rooms, rooms + 5)})
    raw = stores[0].client
    raw.hset(f"kvstatus:{namespace}:{{{rooms + 100}}}", "prefill-0", "2")  # a key without TTL
    raw.hset(f"kvstatus:{namespace}:{{{rooms + 101}}}", "prefill-0", "banana")
    raw.pexpire(f"kvstatus:{namespace}:{{{rooms + 101}}}", 600_000)
    for store in stores + [straggler]:
        store.close()


def test_exporter_numbers_agree_with_stats_json_and_it_stops_on_sigterm(redis_server: RedisServer) -> None:
    first, second = fresh_namespace("exp"), fresh_namespace("exp")
    populate(redis_server.url, first, 400)
    populate(redis_server.url, second, 60)
    with ServerProcess(
        "--url",
        redis_server.url,
        "exporter",
        first,
        second,
        "--port",
        "0",
        "--interval",
        "0.5",
        "--batch",
        "50",
        "--ttl",
        "600",
    ) as exporter:
        metrics = exporter.base + "/metrics"
        for namespace in (first, second):
            expected = stats_json(redis_server.url, namespace)
            got = wait_until(
                lambda: (s := scrape(metrics)) and sample(s, "kvstatus_rooms", namespace=namespace) is not None and s,  # noqa: B023 - used at once, in this iteration
                30,
                "a completed pass",
            )
            assert sample(got, "kvstatus_up", namespace=namespace) == 1
            assert sample(got, "kvstatus_rooms", namespace=namespace) == expected["rooms"]
            assert set(expected["by_participant"]) == {"prefill-0", "prefill-1", "decode-0", "decode-1"}
            for participant, counts in expected["by_participant"].items():
                for status, count in counts.items():
                    assert (
                        sample(got, "kvstatus_entries", namespace=namespace, participant=participant, status=status)
                        == count
                    ), (participant, status)
            assert sample(got, "kvstatus_keys_without_ttl", namespace=namespace) == expected["keys_without_ttl"] == 1
            assert sample(got, "kvstatus_corrupted_rooms", namespace=namespace) == expected["corrupted_rooms"] == 1
            for bucket, count in expected["ttl_left"].items():
                assert sample(got, "kvstatus_rooms_by_ttl_left", namespace=namespace, bucket=bucket) == count
            stages = first_failures(redis_server.url, namespace)
            assert stages["transfer"] > 0  # populate's Failed updates recorded first failures
            for stage in Stage:
                assert (
                    sample(got, "kvstatus_rooms_by_failure_stage", namespace=namespace, stage=stage.value)
                    == stages[stage.value]
                ), stage
            oldest_ttl = expected["oldest_non_terminal"][0]["ttl_ms"] / 1000
            assert oldest_ttl < 41
            age = sample(got, "kvstatus_oldest_non_terminal_age_seconds", namespace=namespace)
            assert age == pytest.approx(600 - oldest_ttl, abs=3)
            assert sample(got, "kvstatus_rooms_on_lost_participants", namespace=namespace) == 0
            assert sample(got, "kvstatus_lease_tracking", namespace=namespace) == 1  # kvstatus exporter reads leases
            assert (
                sample(got, "kvstatus_exporter_scanned_keys", namespace=namespace)
                == expected["rooms"] + expected["corrupted_rooms"]
            )
            assert sample(got, "kvstatus_exporter_scan_duration_seconds", namespace=namespace) > 0
            assert sample(got, "kvstatus_exporter_last_success_timestamp_seconds", namespace=namespace) > 1.7e9
            assert sample(got, "kvstatus_exporter_scan_errors_total", namespace=namespace) == 0
        served = {name for name, _ in got}
        for name in METRICS:
            assert name in served or name + "_total" in served or name + "_bucket" in served, name
        assert exporter.terminate() == 0
        assert "Traceback" not in exporter.output


def test_exporter_survives_a_redis_restart_and_never_shows_the_password() -> None:
    namespace = fresh_namespace("exp")
    with RedisServer(password=PASSWORD) as server:
        store = StatusStore.from_url(server.url, namespace=namespace, participant="p")
        store.update_many({room: KVPoll.Bootstrapping for room in range(30)})
        with ServerProcess(
            "--url", server.url, "--namespace", namespace, "exporter", "--port", "0", "--interval", "0.3"
        ) as exporter:
            metrics = exporter.base + "/metrics"
            wait_until(lambda: sample(scrape(metrics), "kvstatus_rooms", namespace=namespace) == 30, 30, "30 rooms")
            server.kill()
            down = wait_until(
                lambda: (s := scrape(metrics)) and sample(s, "kvstatus_up", namespace=namespace) == 0 and s, 60, "up 0"
            )
            assert sample(down, "kvstatus_rooms", namespace=namespace) is None  # a gap, not stale numbers
            assert sample(down, "kvstatus_exporter_last_success_timestamp_seconds", namespace=namespace) > 0
            assert exporter.proc.poll() is None
            server.restart()
            store = StatusStore.from_url(server.url, namespace=namespace, participant="p")
            store.update_many({room: KVPoll.Transferring for room in range(12)})
            up = wait_until(
                lambda: (s := scrape(metrics)) and sample(s, "kvstatus_rooms", namespace=namespace) == 12 and s,
                60,
                "the exporter to see the restarted Redis",
            )
            assert sample(up, "kvstatus_up", namespace=namespace) == 1
            assert sample(up, "kvstatus_entries", namespace=namespace, participant="p", status="Transferring") == 12
            assert sample(up, "kvstatus_exporter_scan_errors_total", namespace=namespace) >= 1
            assert exporter.terminate() == 0
            output = exporter.output
    assert "Traceback" not in output
    assert PASSWORD not in output and "***" in output
    assert "pass failed" in output and "answers again" in output


def test_exporter_without_redis_reports_up_0_and_exits_0_on_sigterm() -> None:
    namespace = fresh_namespace("exp")
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    with ServerProcess("--url", url, "--namespace", namespace, "exporter", "--port", "0", "--interval", "0.2") as exp:
        samples = wait_until(
            lambda: (
                (s := scrape(exp.base + "/metrics"))
                and sample(s, "kvstatus_exporter_scan_errors_total", namespace=namespace)
                and s
            ),
            60,
            "a failed pass",
        )
        assert sample(samples, "kvstatus_up", namespace=namespace) == 0
        assert sample(samples, "kvstatus_exporter_last_success_timestamp_seconds", namespace=namespace) == 0
        assert exp.terminate() == 0
        assert PASSWORD not in exp.output and "Traceback" not in exp.output


def test_exporter_usage_errors_are_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}
    done = subprocess.run(
        [sys.executable, "-m", "kvstatus.cli", "exporter", "bad{ns}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2 and "invalid namespace" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "kvstatus.cli", "exporter"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2 and "no namespace" in done.stderr


def test_a_string_at_a_tombstone_name_leaves_the_exporter_up_and_is_counted(redis_server: RedisServer) -> None:
    """Issue 36: a tenant's SET at a tombstone name emptied the exporter (kvstatus_up 0, every series gone)."""
    namespace = fresh_namespace("exp")
    populate(redis_server.url, namespace, 20)
    client = redis.Redis.from_url(redis_server.url)
    client.set(KeySchema(namespace).tombstone_key(10**12), "junk")  # no room of that id
    client.set(KeySchema(namespace).tombstone_key(1), "junk")  # beside a live room
    client.close()
    with ServerProcess(
        "--url", redis_server.url, "exporter", namespace, "--port", "0", "--interval", "0.5", "--ttl", "600"
    ) as exporter:
        metrics = exporter.base + "/metrics"
        got = wait_until(
            lambda: (s := scrape(metrics)) and sample(s, "kvstatus_rooms", namespace=namespace) is not None and s,
            30,
            "a completed pass",
        )
        assert sample(got, "kvstatus_up", namespace=namespace) == 1
        assert sample(got, "kvstatus_rooms", namespace=namespace) == stats_json(redis_server.url, namespace)["rooms"]
        assert sample(got, "kvstatus_corrupted_rooms", namespace=namespace) >= 2  # populate's own, and the strings
