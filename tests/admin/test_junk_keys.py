"""One junk key never stops a namespace's tools (issue 36): a tool skips and counts a key that holds what kvstatus
does not write, names a sample of them, and goes on with every other room and participant."""

from __future__ import annotations

from typing import Any

from kvstatus import KVPoll
from kvstatus.admin.health import HealthSettings, read_health
from kvstatus.admin.reads import iter_leases, iter_room_keys
from kvstatus.admin.sweep import sweep
from kvstatus.keys import KeySchema
from tests.helpers.backends import RedisUnderTest
from tests.helpers.cli import invoke

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed


def _expire(raw: Any, namespace: str, participant: str) -> None:
    raw.hset(f"kvstatus:{namespace}:lease:{participant}", "deadline", 1)


def test_a_sweep_skips_and_counts_junk_keys_and_sweeps_every_other_lost_participant(backend: RedisUnderTest) -> None:
    """A string among the rooms aborted the sweep without naming it; a lease record with epoch=1e300 (a router
    recipe's HSET) stopped the sweep of every other lost participant; a string at a lease record's name too."""
    raw, ns = backend.raw, backend.namespace
    schema = KeySchema(ns)
    forged = backend.store(participant="decode-1", lease_ttl=3)
    dead = backend.store(participant="decode-2", lease_ttl=3)
    for room in range(1, 6):
        forged.update_status(room, W)
        dead.update_status(room, T)
    raw.set(schema.room_key(3), "junk")  # a wrong-type key among the rooms
    raw.hset(schema.room_key(4), "decode-2", "seven")  # a status kvstatus does not write
    raw.set(schema.lease_key("decode-9"), "junk")  # a string at a lease record's name
    _expire(raw, ns, "decode-1")
    _expire(raw, ns, "decode-2")
    raw.hset(schema.lease_key("decode-1"), "epoch", "1e300")
    result = sweep(raw, schema, batch=500)
    assert result.lost == ["decode-1", "decode-2"]
    assert result.by_participant == {"decode-1": 3, "decode-2": 3}  # rooms 1, 2, 5 each; 3 and 4 skipped
    assert result.skipped == 3, result.skipped_sample
    sample = "\n".join(result.skipped_sample)
    for key in (schema.room_key(3), schema.room_key(4), schema.lease_key("decode-9")):
        assert key in sample, sample
    for room in (1, 2, 5):
        view = dead.room(room)
        assert (view.participants["decode-1"].status, view.participants["decode-2"].status) == (F, F)
    assert result.to_json()["skipped_keys"] == 3


def test_health_reads_a_namespace_with_a_string_at_a_tombstone_name(backend: RedisUnderTest) -> None:
    """A string at a tombstone name made `kvstatus health` exit 1 with no output, emptied the exporter and made the
    board's /api/pairs answer 503: now the key is counted, named, and every room is still judged."""
    raw, schema = backend.raw, KeySchema(backend.namespace)
    prefill = backend.store(participant="prefill-0", timeline=True)
    decode = backend.store(participant="decode-0", timeline=True)
    for room in (1, 2):
        prefill.update_status(room, S)
        decode.update_status(room, S)
    raw.set(schema.tombstone_key(1), "junk")  # beside a live room
    raw.set(schema.tombstone_key(7), "junk")  # a tombstone name whose room does not exist
    health = read_health(raw, schema, HealthSettings())
    assert health.rooms == 2 and health.corrupted == 2, health
    assert {pair.prefill for pair in health.pairs} == {"prefill-0"}
    sample = "\n".join(health.to_json()["corrupted_sample"])
    assert schema.tombstone_key(1) in sample and schema.tombstone_key(7) in sample, sample
    view = prefill.room(1)  # room() reads the room all the same, and names the key it left out
    assert view.participants["prefill-0"].status is S and view.tombstone is None
    assert [m for m in view.ignored if schema.tombstone_key(1) in m], view.ignored


def test_a_key_name_that_is_not_utf8_is_passed_over_by_every_scan(backend: RedisUnderTest) -> None:
    """A key of the namespace's SCAN patterns whose name is not UTF-8 (kvstatus writes ASCII names only) made
    `ls`, `ls --stuck`, `stats`, `health` and `watch` end in a UnicodeDecodeError traceback: now it is passed
    over like any other key kvstatus does not write."""
    raw, ns = backend.raw, backend.namespace
    schema = KeySchema(ns)
    backend.store(participant="prefill-0", timeline=True).update_status(5, T)
    raw.hset(f"kvstatus:{ns}:".encode() + b"{\xff}", "prefill-0", "1")  # a room key's shape, not its name
    raw.set(f"kvstatus:{ns}:".encode() + b"{\xfe}:t", "x")  # a tombstone's
    raw.hset(f"kvstatus:{ns}:lease:".encode() + b"\xfd", "deadline", "1")  # a lease record's

    def connect(url: str) -> Any:
        return raw

    if "cluster" not in backend.name:  # the CLI's cluster client is its own (tests/cli/test_topologies.py)
        for args in (["ls"], ["ls", "--stuck"], ["stats"], ["health"], ["watch", "--count", "1"], ["participants"]):
            result = invoke(connect, "--namespace", ns, *args)
            assert result.exit_code == 0 and "Traceback" not in result.output, (args, result.output)
    assert [key for keys in iter_room_keys(raw, schema) for key in keys] == [schema.room_key(5)]
    assert read_health(raw, schema, HealthSettings()).rooms == 1
    assert list(iter_leases(raw, schema)) == []
