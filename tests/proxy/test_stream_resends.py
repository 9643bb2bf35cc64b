"""A request its stream ended under is sent again unary within its own budget: the resend
gets what remains of the request's deadline, not a fresh one (it got a fresh one, and a
stream that ended late answered a 0.5 s request after ~0.6 s)."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from grpc import aio

from protos import wire
from proxy.transport.channels import Channels
from proxy.transport.failures import CallFailed
from proxy.transport.target import Target
from tests.proxy.scripted import affine
from tests.proxy.test_streams import OneShotStreams


class LateEndingStreams(OneShotStreams):
    """A v2 server whose ModelStreamInfer reads a request, holds it `hold_s` and ends the
    stream unanswered (the proxy then calls it unary); its unary calls answer."""

    def __init__(self, delay_s: float, hold_s: float) -> None:
        super().__init__(affine("plus1", 1, 1, delay_s=delay_s), wrapped=True)
        self.hold_s = hold_s

    async def _stream(self, requests, context: aio.ServicerContext):
        async for _ in requests:
            self.streams += 1
            await asyncio.sleep(self.hold_s)
            return
        yield wire.stream_response(None)  # never reached: makes this an async generator


@pytest.mark.parametrize(
    ("budget_s", "answered"), [(0.5, False), (1.5, True)], ids=["spent", "left"]
)
async def test_a_resent_request_keeps_its_deadline(budget_s: float, answered: bool) -> None:
    server = LateEndingStreams(delay_s=0.3, hold_s=0.3)
    port = await server.start()
    channels = Channels(streams=1)
    target = Target("M_URL", f"127.0.0.1:{port}", "plus1")
    x = np.ones((1, 2), np.float32)
    try:
        if answered:
            answer = await channels.infer(target, {"x": x}, timeout=budget_s, request_id="r")
            assert answer["y"].tolist() == [[2.0, 2.0]]
        else:
            with pytest.raises(CallFailed) as late:
                await channels.infer(target, {"x": x}, timeout=budget_s, request_id="r")
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, late.value
    finally:
        await channels.close()
        await server.server.stop(0)
    assert server.streams == 1, "the request went on a stream first"
    assert server.infer_calls == 1, "and was sent again, unary"
