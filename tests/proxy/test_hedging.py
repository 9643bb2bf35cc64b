"""A replica that stalls (answers nothing, no error) behind a name of two replicas: calls
late on it are sent to the other one too, the first answer wins, and the stalled replica is
passed over while it stays late (proxy/transport/: hedging.py, balancing.py), on streams and on
unary calls. Real gRPC servers on 127.0.0.1 and 127.0.0.2."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

from proxy.transport.balancing import Replicas
from proxy.transport.channels import Channels
from proxy.transport.target import Target
from tests.proxy.scripted import ScriptedModel, serve

TRANSPORTS = pytest.mark.parametrize("streams", [2, 0], ids=["streams", "unary"])


def _model(frozen: asyncio.Event, served: list[int], stuck: list[int]) -> ScriptedModel:
    async def fn(inputs, deadline):
        if frozen.is_set():
            stuck.append(1)
            await asyncio.sleep(3600)  # frozen: it never answers
        served.append(1)
        await asyncio.sleep(0.002)
        return {"y": inputs["x"] + 1}

    return ScriptedModel("m", fn)


async def test_a_replica_with_a_stalled_call_is_passed_over() -> None:
    replicas = Replicas("ipv4:10.0.0.1:1,10.0.0.2:1", 10.0, lambda address, connect: None)
    late, fine = replicas._replicas.values()
    replicas.pace.observe(0.002)
    late.calls.begin(1, now=time.monotonic() - 1.0)  # out for a second: stalled
    for call in (2, 3, 4):
        fine.calls.begin(call)  # busier, but answering
    assert {(await replicas.pick()).address for _ in range(4)} == {fine.address}
    assert replicas.alternative(late) is fine and replicas.alternative(fine) is None
    late.calls.end(1)
    assert late.address in {(await replicas.pick()).address for _ in range(4)}


@pytest.mark.alone  # its replica is passed over by timing: 20 of 40 burst calls reached the
# frozen one with the other test worker beside it (2026-11-26)
@TRANSPORTS
async def test_calls_stalled_on_one_replica_are_answered_by_the_other(streams: int) -> None:
    frozen, healthy = asyncio.Event(), asyncio.Event()
    served: dict[str, list[int]] = {"127.0.0.1": [], "127.0.0.2": []}
    stuck: list[int] = []
    """Calls that reached the frozen replica."""
    servers = {
        "127.0.0.1": await serve(_model(healthy, served["127.0.0.1"], []), host="127.0.0.1"),
        "127.0.0.2": await serve(_model(frozen, served["127.0.0.2"], stuck), host="127.0.0.2"),
    }
    name = "ipv4:" + ",".join(f"{h}:{s.port}" for h, s in servers.items())
    channels = Channels(streams=streams)
    target = Target("M_URL", name, "m")
    loop = asyncio.get_running_loop()

    async def one(i: int) -> float:
        start = loop.time()
        x = np.full((1, 2), float(i), np.float32)
        answer = await channels.infer(target, {"x": x}, timeout=3.0, request_id=f"r{i}")
        assert answer["y"][0, 0] == i + 1.0
        return loop.time() - start

    try:
        for i in range(20):  # both replicas answer; the name learns its pace
            await one(i)
        assert min(len(s) for s in served.values()) >= 5
        frozen.set()
        before = len(served["127.0.0.2"])
        one_by_one = [await one(i) for i in range(40)]
        probes = len(stuck)
        burst = await asyncio.gather(*(one(i) for i in range(40)))
    finally:
        await channels.close()
        for server in servers.values():
            await server.stop(0)
    waits = one_by_one + burst
    assert max(waits) < 1.0, "a call waited on the frozen replica instead of going elsewhere"
    assert len(served["127.0.0.2"]) == before
    # Passed over once late, counted where the calls arrived (not by their time, which a
    # loaded machine stretches: in full-suite runs healthy burst calls took 48-54 ms): after
    # the freeze a few probes one by one (its pause doubles each time), and a burst sends it
    # one call at a time while it is failing.
    assert probes <= 8, probes
    assert len(stuck) - probes <= 1, len(stuck) - probes

    # What an operator sees: the replica passed over once (a spell, not each probe), and
    # every call that reached it hedged and answered by the other replica.
    def count(metric: str) -> float:
        return REGISTRY.get_sample_value(metric, {"endpoint": name}) or 0

    assert count("proxy_replicas_passed_over_total") == 1
    assert count("proxy_hedged_calls_total") == count("proxy_hedges_won_total") == len(stuck)
