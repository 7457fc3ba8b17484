"""``PUBSUB NUMSUB`` / ``SHARDNUMSUB`` replies in every shape redis-py hands them over (no Redis)."""

from __future__ import annotations

import pytest

from kvstatus.replies import SHARD_NUMSUB, merge_shard_counts, subscriber_counts

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "reply",
    [
        [b"a", 1, b"b", 0],  # a server's flat reply
        [(b"a", 1), (b"b", 0)],  # redis-py's pairs (NUMSUB on one server)
        {"127.0.0.1:7000": [b"a", 1, b"b", 0]},  # a cluster client's {node: reply}
        {"127.0.0.1:7000": [b"a", 1], "127.0.0.1:7001": [(b"b", 0)]},
    ],
)
def test_every_shape_reads_the_same(reply: object) -> None:
    assert subscriber_counts(reply) == {"a": 1, "b": 0}


def test_nodes_sum_and_an_empty_reply_counts_nobody() -> None:
    assert subscriber_counts({"n1": [b"a", 1], "n2": [b"a", 2]}) == {"a": 3}
    assert subscriber_counts([]) == {} and subscriber_counts(None) == {}


def test_a_cluster_client_gets_a_merge_that_reads_flat_node_replies() -> None:
    """redis-py 8.2's own merge raised ValueError on a node's flat SHARDNUMSUB reply."""
    from redis.cluster import RedisCluster

    client = RedisCluster.__new__(RedisCluster)
    client.result_callbacks = dict(RedisCluster.RESULT_CALLBACKS)
    merge_shard_counts(client)
    merged = client.result_callbacks[SHARD_NUMSUB](SHARD_NUMSUB, {"n1": [b"a", 1, b"b", 0]})
    assert subscriber_counts(merged) == {"a": 1, "b": 0}
    merge_shard_counts(object())  # a client without result callbacks is left alone
