"""Every command through click's CliRunner against fakeredis, the client injected through CliEnv.connect."""

from __future__ import annotations

import json

import fakeredis
import pytest

from kvstatus import KVPoll
from kvstatus.keys import PROBE_PARTICIPANT
from tests.helpers.cli import NS, assert_clean_failure, cli, invoke, json_lines


def test_set_goes_through_the_rule_and_prints_the_outcome(connect, store):
    assert (
        cli(connect, "set", "42", "bootstrapping", "-p", "prefill-0").output
        == "room 42 prefill-0: CREATED -> Bootstrapping(1)\n"
    )
    assert "ADVANCED -> Transferring(3)" in cli(connect, "set", "42", "3", "-p", "prefill-0").output
    assert "UNCHANGED -> Transferring(3)" in cli(connect, "set", "42", "WaitingForInput", "-p", "prefill-0").output
    assert store.for_participant("prefill-0").get(42) == KVPoll.Transferring
    late = cli(connect, "set", "43", "failed")
    assert late.exit_code == 0 and "IGNORED_MISSING -> -" in late.output
    assert store.room(43).exists is False
    strict = cli(connect, "set", "44", "success", "--policy", "strict", "--json")
    assert json.loads(strict.stdout)["outcome"] == "REFUSED_CREATE" and strict.exit_code == 6


def test_set_failed_with_reason_records_it_and_reason_needs_failed(connect, store):
    cli(connect, "set", "7", "transferring")
    out = cli(connect, "set", "7", "failed", "--reason", "NIXL transfer timed out", "--json")
    assert json.loads(out.output) == {
        "room": 7,
        "participant": "default",
        "outcome": "FAILED",
        "status": "Failed",
        "reason_recorded": True,
    }
    assert store.room(7).participants["default"].reason == "NIXL transfer timed out"
    bad = cli(connect, "set", "7", "success", "--reason", "x")
    assert_clean_failure(bad.output, bad.exit_code, 2, "--reason goes with status Failed only")


def test_set_honours_ttl(connect, store):
    cli(connect, "set", "8", "1", "--ttl", "50")
    assert 0 < store.room(8).ttl_ms <= 50_000


def test_get_shows_every_participant_reason_and_ttl(connect, store):
    store.for_participant("prefill-0").update_status(42, KVPoll.Transferring)
    decode = store.for_participant("decode-0")
    decode.update_status(42, KVPoll.WaitingForInput)
    decode.update_status(42, KVPoll.Failed)
    decode.record_failure(42, "decode OOM")
    result = cli(connect, "get", "42")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["ROOM", "PARTICIPANT", "STATUS", "TTL", "LEFT", "REASON"]
    assert lines[1].split()[:3] == ["42", "decode-0", "Failed(0)"] and lines[1].endswith("decode OOM")
    # prefill-0's own entry is still Transferring, and its reads answer Failed: the room failed (shared fate)
    assert lines[2].split()[:3] == ["42", "prefill-0", "Failed(0)"]
    assert "shared fate (own entry Transferring(3)): failed at waiting by decode-0" in lines[2]
    doc = json.loads(cli(connect, "get", "42", "--json").output)
    room = doc["rooms"][0]
    assert room["participants"]["decode-0"] == {
        "status": "Failed",
        "value": 0,
        "reason": "decode OOM",
        "reads": "Failed",
    }
    assert room["participants"]["prefill-0"]["status"] == "Transferring"
    assert room["participants"]["prefill-0"]["reads"] == "Failed"
    assert 0 < room["ttl_ms"] <= 600_000


def test_get_missing_room_exits_1(connect, store):
    store.update_status(1, KVPoll.Bootstrapping)
    result = cli(connect, "get", "1", "99")
    assert_clean_failure(result.output, result.exit_code, 1, "room 99 not found in namespace 'prod-a'")
    assert "Bootstrapping(1)" in result.output


def test_clear_removes_only_the_participant_entry(connect, store):
    store.for_participant("prefill-0").update_status(5, KVPoll.Success)
    store.for_participant("decode-0").update_status(5, KVPoll.Success)
    assert cli(connect, "clear", "5", "-p", "prefill-0").output == "room 5 prefill-0: cleared\n"
    assert cli(connect, "clear", "5", "-p", "prefill-0").output == "room 5 prefill-0: nothing to clear\n"
    assert list(store.room(5).participants) == ["decode-0"]
    doc = json.loads(cli(connect, "clear", "5", "6", "-p", "decode-0", "--json").output)
    assert doc == {
        "namespace": NS,
        "participant": "decode-0",
        "rooms": [{"room": 5, "cleared": True}, {"room": 6, "cleared": False}],
    }
    assert not store.room(5).exists


def test_ls_streams_every_room_in_small_batches_with_filters(connect, store):
    prefill, decode = store.for_participant("prefill-0"), store.for_participant("decode-0")
    prefill.update_many({room: KVPoll.Transferring for room in range(1, 26)})
    decode.update_many({room: KVPoll.WaitingForInput for room in range(1, 26)})
    decode.update_many({room: KVPoll.Failed for room in range(5, 26, 5)})
    rooms = json_lines(cli(connect, "ls", "--batch", "3", "--json").output)
    assert sorted(r["room"] for r in rooms) == list(range(1, 26))
    failed = json_lines(cli(connect, "ls", "--status", "failed", "--json").output)
    assert sorted(r["room"] for r in failed) == [5, 10, 15, 20, 25]
    table = cli(connect, "ls", "-s", "0", "-p", "decode-0").output.splitlines()
    assert table[0].split()[:3] == ["ROOM", "PARTICIPANT", "STATUS"]
    assert sorted(int(line.split()[0]) for line in table[1:]) == [5, 10, 15, 20, 25]
    assert all(line.split()[1:3] == ["decode-0", "Failed(0)"] for line in table[1:])
    assert len(json_lines(cli(connect, "ls", "--limit", "4", "--json").output)) == 4
    assert cli(connect, "ls", "-p", "nobody", "--json").output == ""


def test_stats_counts_and_audits_ttl(connect, store, server):
    store.for_participant("prefill-0").update_many({1: KVPoll.Success, 2: KVPoll.Transferring, 3: KVPoll.Bootstrapping})
    store.for_participant("decode-0").update_status(3, KVPoll.WaitingForInput)
    raw = fakeredis.FakeRedis(server=server)
    raw.hset(store.schema.room_key(9), "decode-0", "2")  # a key kvstatus would never write: no TTL
    doc = json.loads(cli(connect, "stats", "--json").output)
    assert doc["rooms"] == 4 and doc["entries"] == 5
    assert doc["by_status"] == {"Failed": 0, "Bootstrapping": 1, "WaitingForInput": 2, "Transferring": 1, "Success": 1}
    assert doc["by_participant"]["decode-0"]["WaitingForInput"] == 2
    assert doc["keys_without_ttl"] == 1 and doc["keys_without_ttl_sample"] == [9]
    assert doc["ttl_left"]["300-600s"] == 3 and doc["ttl_left"]["no TTL"] == 1
    assert sorted(r["room"] for r in doc["oldest_non_terminal"]) == [2, 3]
    text = cli(connect, "stats").output
    assert "LEAK: 1 room key has NO TTL" in text
    raw.delete(store.schema.room_key(9))
    assert "keys without TTL: 0" in cli(connect, "stats").output


def test_watch_streams_snapshots_as_json_lines(connect, store):
    store.update_status(1, KVPoll.Bootstrapping)
    store.update_status(2, KVPoll.Transferring)
    events = json_lines(cli(connect, "watch", "--count", "2", "--interval", "0.1", "--json").output)
    assert [e["event"] for e in events] == ["snapshot", "snapshot"]
    assert events[1]["rooms"] == 2 and events[1]["by_status"]["Transferring"] == 1


def test_watch_table(connect, store):
    store.update_status(1, KVPoll.Bootstrapping)
    result = cli(connect, "watch", "--count", "1")
    assert result.exit_code == 0
    assert "rooms 1  entries: Failed 0  Bootstrapping 1" in result.output
    assert "since last refresh: new 0  advanced 0  failed 0  cleared 0" in result.output


def test_explain_is_offline_and_follows_the_reference(connect):
    def no_redis(url: str):
        raise AssertionError("explain must not connect")

    out = invoke(no_redis, "explain", "missing", "failed")
    assert out.exit_code == 0 and "IGNORED_MISSING" in out.output and "resurrect" in out.output
    doc = json.loads(invoke(no_redis, "explain", "failed", "4", "--policy", "strict", "--json").output)
    assert (doc["outcome"], doc["status"]) == ("REFUSED_TERMINAL", "Failed")
    assert json.loads(invoke(no_redis, "explain", "0", "success", "--json").output)["outcome"] == "ADVANCED"
    bad = invoke(no_redis, "explain", "sideways", "1")
    assert_clean_failure(bad.output, bad.exit_code, 2, "invalid status 'sideways'")


def test_doctor_on_fakeredis_passes_and_leaves_nothing(connect, store, server):
    result = cli(connect, "doctor")
    assert result.exit_code == 0, result.output
    names = [line.split()[1] for line in result.output.splitlines()]
    assert names[:5] == ["connectivity", "server", "topology", "script", "ttl"]
    assert all(line.split()[0] in ("ok", "warn") for line in result.output.splitlines())  # one verdict a line
    assert list(fakeredis.FakeRedis(server=server).scan_iter(match="*")) == []
    doc = json.loads(cli(connect, "doctor", "--json").output)
    assert {c["check"] for c in doc["checks"]} >= {"acl update_status", "acl scan", "acl script load"}
    low = cli(connect, "doctor", "--ttl", "60")
    assert_clean_failure(low.output, low.exit_code, 1, "below SGLang's 300 s timeouts")


def test_probe_entry_is_never_counted(connect, store):
    store.for_participant(PROBE_PARTICIPANT).update_status(3, KVPoll.Bootstrapping)
    store.update_status(4, KVPoll.Bootstrapping)
    store.for_participant(PROBE_PARTICIPANT).update_status(4, KVPoll.Bootstrapping)
    assert [r["room"] for r in json_lines(cli(connect, "ls", "--json").output)] == [4]
    assert json.loads(cli(connect, "stats", "--json").output)["entries"] == 1
    assert PROBE_PARTICIPANT not in cli(connect, "get", "4").output


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["get", "abc"], 2, "invalid room 'abc'"),
        (["get", "-1"], 2, "negative numbers are no room"),
        (["get", str(2**63)], 2, "invalid room 9223372036854775808"),
        (["set", "1", "done"], 2, "invalid status 'done'"),
        (["set", "1", "7"], 2, "invalid status '7'"),
        (["set", "1", "1", "-p", "pre fill"], 2, "invalid participant 'pre fill'"),
        (["set", "1", "1", "--ttl", "-3"], 2, "invalid ttl -3.0"),
        (["ls", "--status", "finished"], 2, "invalid status 'finished'"),
    ],
)
def test_bad_input_is_a_usage_error(connect, args, code, needle):
    result = cli(connect, *args)
    assert_clean_failure(result.output, result.exit_code, code, needle)


@pytest.mark.parametrize("namespace", ["bad ns", "a{b}", "prod*", ""])
def test_bad_namespace_is_a_usage_error(connect, namespace):
    result = invoke(connect, "--namespace", namespace, "get", "1")
    expected = f"invalid namespace {namespace!r}"
    assert_clean_failure(result.output, result.exit_code, 2, expected)


def test_namespace_from_environment_and_missing_namespace(connect, store):
    store.update_status(1, KVPoll.Bootstrapping)
    assert invoke(connect, "get", "1", env={"KVSTATUS_NAMESPACE": NS}).exit_code == 0
    missing = invoke(connect, "get", "1")
    assert_clean_failure(
        missing.output, missing.exit_code, 2, "no namespace: pass --namespace NAME or set KVSTATUS_NAMESPACE"
    )


def test_bad_url_is_a_usage_error_and_masks_the_password(connect):
    result = invoke(connect, "--url", "http://admin:hunter2@host/0", "--namespace", NS, "get", "1")
    assert_clean_failure(result.output, result.exit_code, 2, "unsupported scheme 'http'", "***", secrets=("hunter2",))


def test_corrupted_value_is_an_operational_error(connect, store, server):
    fakeredis.FakeRedis(server=server).hset(store.schema.room_key(3), "default", "banana")
    result = cli(connect, "get", "3")
    assert_clean_failure(result.output, result.exit_code, 1, "not a status 0..4", "left as it is")


def test_stats_counts_corrupted_rooms_and_goes_on(connect, store, server):
    store.update_status(1, KVPoll.Bootstrapping)
    fakeredis.FakeRedis(server=server).hset(store.schema.room_key(2), "default", "banana")
    doc = json.loads(cli(connect, "stats", "--json").output)
    assert doc["rooms"] == 1 and doc["corrupted_rooms"] == 1
    assert "holds 'banana'" in doc["corrupted_sample"][0]
    text = cli(connect, "stats").output
    assert "CORRUPTED: 1 room holds values kvstatus does not write" in text
    listed = cli(connect, "ls", "--json")
    assert_clean_failure(
        listed.output,
        listed.exit_code,
        1,
        "warning: skipped room 2",
        "holds 'banana'",
        "1 room holds values kvstatus does not write",
    )
    assert [r["room"] for r in json_lines(listed.stdout)] == [1]


def test_watch_skips_corrupted_rooms_and_says_so(connect, store, server):
    store.update_status(1, KVPoll.Bootstrapping)
    fakeredis.FakeRedis(server=server).hset(store.schema.room_key(2), "default", "banana")
    assert "rooms 1  entries: Failed 0  Bootstrapping 1" in cli(connect, "watch", "--count", "1").output
    assert "(skipped 1 corrupted room)" in cli(connect, "watch", "--count", "1").output
    assert json_lines(cli(connect, "watch", "--count", "1", "--json").output)[0]["corrupted"] == 1


def test_a_key_of_another_type_is_skipped_as_corrupted(connect, store, server):
    store.update_status(1, KVPoll.Bootstrapping)
    fakeredis.FakeRedis(server=server).set(store.schema.room_key(2), "not a hash", ex=600)
    doc = json.loads(cli(connect, "stats", "--json").output)
    assert doc["rooms"] == 1 and doc["corrupted_rooms"] == 1
    assert "not a kvstatus room hash" in doc["corrupted_sample"][0]
    listed = cli(connect, "ls", "--json")
    assert_clean_failure(listed.output, listed.exit_code, 1, "warning: skipped room 2")
    assert [r["room"] for r in json_lines(listed.stdout)] == [1]
    assert "(skipped 1 corrupted room)" in cli(connect, "watch", "--count", "1").output
