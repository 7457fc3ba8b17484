"""The per-worker port slices of tests/servers/ports.py: disjoint, below the ephemeral range, each port once."""

from __future__ import annotations

import socket

import pytest

from kvstatus.demo.server import LOOPBACK, RedisServerError
from tests.servers import RedisServer, ports
from tests.servers.ports import CLUSTER_BUS_OFFSET


def test_the_slices_of_the_workers_are_disjoint_and_cover_the_range() -> None:
    for count in (1, 2, 3, 8):
        slices = [ports.PortRange(index, count) for index in range(count)]
        assert slices[0].first == ports.FIRST
        for before, after in zip(slices, slices[1:]):
            assert before.last < after.first
        assert slices[-1].last <= ports.LAST
    assert ports.LAST + CLUSTER_BUS_OFFSET < 32768, "bus ports must stay below Linux's ephemeral range"
    with pytest.raises(ValueError, match="not in 0..1"):
        ports.PortRange(2, 2)


def test_a_port_is_handed_out_once_and_a_taken_one_is_skipped() -> None:
    taken = ports.PortRange(1, 2)
    first = taken.take()
    with socket.socket() as listener:
        port = first
        while True:  # the next port of the slice that nothing holds (the suite's own servers use these ports too)
            port = port + 1 if port < taken.last else taken.first
            try:
                listener.bind((LOOPBACK, port))
                break
            except OSError:
                continue
        listener.listen()
        busy = listener.getsockname()[1]
        given = {first} | {taken.take() for _ in range(20)}
    assert len(given) == 21 and busy not in given
    assert all(port in taken for port in given)


def test_a_port_whose_cluster_bus_port_is_taken_is_skipped() -> None:
    slice_ = ports.PortRange(1, 2)
    first = slice_.take()
    following = first + 1 if first < slice_.last else slice_.first
    with socket.socket() as bus:
        bus.bind((LOOPBACK, following + CLUSTER_BUS_OFFSET))
        bus.listen()
        assert slice_.take() != following


def test_a_range_without_bus_ports_ignores_them() -> None:
    """The e2e tier's range (tests/e2e/deploy.py PORTS) has no cluster nodes: a taken port +10000 is no reason
    to skip a port there. The port comes from this worker's own slice, so no other worker's server holds it or
    its bus port (a fixed range here once met another worker's cluster bus ports, 20000+)."""
    port = ports.free_port()
    without_bus = ports.PortRange(first=port, last=port, bus=False)
    with_bus = ports.PortRange(first=port, last=port)
    with socket.socket() as other:
        other.bind((LOOPBACK, port + CLUSTER_BUS_OFFSET))
        other.listen()
        with pytest.raises(RedisServerError, match=f"no free port left in {port}-{port}"):
            with_bus.take()
        assert without_bus.take() == port
    with pytest.raises(RedisServerError, match="no free port left"):
        without_bus.take()  # each port once


@pytest.mark.real
def test_servers_of_this_process_take_their_ports_from_its_slice() -> None:
    with RedisServer() as server:
        assert ports.FIRST <= server.port <= ports.LAST
        port = server.port
        server.kill()
        assert ports.free_port() != port  # nobody in this process gets the port of a stopped server
        server.restart()
        assert server.port == port and server.client().ping()
