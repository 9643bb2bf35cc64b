"""Which replica the proxy calls next (proxy/transport/balancing.py); tests/e2e/test_balancing.py
runs it against real replicas."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from proxy.transport.balancing import Replicas


def _replicas(target: str, states: dict[str, grpc.ChannelConnectivity] | None = None) -> Replicas:
    known = states or {}
    return Replicas(target, 10.0, lambda address, connect: known.get(address))


async def test_equal_loads_take_turns_and_the_least_busy_wins() -> None:
    replicas = _replicas("ipv4:10.0.0.1:1,10.0.0.2:1,10.0.0.3:1")
    picked = [(await replicas.pick()).address for _ in range(6)]
    assert sorted(picked) == sorted(replicas.addresses * 2)
    busy = {a: 5 for a in replicas.addresses}
    busy["10.0.0.2:1"] = 1
    for i, replica in enumerate(replicas._replicas.values()):
        for call in range(busy[replica.address]):
            replica.calls.begin(10 * i + call)
    assert {(await replicas.pick()).address for _ in range(4)} == {"10.0.0.2:1"}


async def test_a_failed_replica_is_passed_over_until_its_pause_ends() -> None:
    replicas = _replicas("ipv4:10.0.0.1:1,10.0.0.2:1")
    first = await replicas.pick()
    replicas.failed(first)
    assert {(await replicas.pick()).address for _ in range(6)} == {
        a for a in replicas.addresses if a != first.address
    }
    await asyncio.sleep(0.15)  # the first failure's pause: 0.1 s
    assert first.address in {(await replicas.pick()).address for _ in range(6)}
    replicas.succeeded(first)
    assert first.failures == 0


async def test_when_every_replica_failed_the_one_failed_longest_ago_is_tried() -> None:
    replicas = _replicas("ipv4:10.0.0.1:1,10.0.0.2:1")
    a, b = replicas._replicas.values()
    replicas.failed(b)
    replicas.failed(a)
    replicas.failed(a)  # a's pause is now the longer one
    assert (await replicas.pick()) is b


async def test_a_replica_whose_channel_fails_is_passed_over() -> None:
    states = {"10.0.0.1:1": grpc.ChannelConnectivity.TRANSIENT_FAILURE}
    replicas = _replicas("ipv4:10.0.0.1:1,10.0.0.2:1", states)
    assert {(await replicas.pick()).address for _ in range(4)} == {"10.0.0.2:1"}


async def test_dns_names_are_resolved_to_every_address() -> None:
    expected = {
        (f"[{info[4][0]}]" if info[0] == socket.AF_INET6 else info[4][0]) + ":8101"
        for info in socket.getaddrinfo("localhost", 8101, type=socket.SOCK_STREAM)
    }
    replicas = _replicas("dns:///localhost:8101")
    picked = {(await replicas.pick()).address for _ in range(2 * len(expected))}
    assert picked == expected == set(replicas.addresses)
    assert replicas.host == "localhost"


async def test_a_name_that_does_not_resolve_is_a_lookup_error() -> None:
    replicas = _replicas("dns:///no-such-host.invalid:8101")
    with pytest.raises(LookupError, match=r"no-such-host\.invalid"):
        await replicas.pick()


async def test_a_plain_address_may_stand_for_several_connections() -> None:
    replicas = Replicas("10.0.0.1:8101", 10.0, lambda address, connect: None, connections=3)
    picked = {(await replicas.pick()).address for _ in range(3)}
    assert picked == {"10.0.0.1:8101#0", "10.0.0.1:8101#1", "10.0.0.1:8101#2"}


async def test_a_failed_replica_waits_for_its_connection_to_be_ready_again() -> None:
    """A SIGKILLed replica's connection goes IDLE, not failing: after its pause it is still
    passed over, gRPC asked to reconnect, until the connection is READY."""
    asked: list[tuple[str, bool]] = []
    states = {"10.0.0.1:1": grpc.ChannelConnectivity.IDLE}

    def state(address: str, connect: bool) -> grpc.ChannelConnectivity | None:
        asked.append((address, connect))
        return states.get(address, grpc.ChannelConnectivity.READY)

    replicas = Replicas("ipv4:10.0.0.1:1,10.0.0.2:1", 10.0, state)
    dead = next(r for r in replicas._replicas.values() if r.address == "10.0.0.1:1")
    replicas.failed(dead)
    await asyncio.sleep(0.15)  # past the pause
    assert {(await replicas.pick()).address for _ in range(4)} == {"10.0.0.2:1"}
    assert ("10.0.0.1:1", True) in asked
    states["10.0.0.1:1"] = grpc.ChannelConnectivity.READY
    assert "10.0.0.1:1" in {(await replicas.pick()).address for _ in range(4)}


async def test_a_failed_replica_gets_one_call_at_a_time_until_one_succeeds() -> None:
    replicas = _replicas("ipv4:10.0.0.1:1,10.0.0.2:1")
    bad, good = replicas._replicas.values()
    replicas.failed(bad)
    await asyncio.sleep(0.15)  # past its pause
    bad.calls.begin(1)  # the one probing call
    assert {(await replicas.pick()).address for _ in range(6)} == {good.address}
    bad.calls.end(1)
    assert bad.address in {(await replicas.pick()).address for _ in range(4)}
