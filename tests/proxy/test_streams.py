"""The stream transport (proxy/transport/streams.py) against real gRPC servers: streams are what is
used, a server without them is called unary, a dying server fails only what was in flight
(each request answered once) and a new stream is opened when it is back."""

from __future__ import annotations

import asyncio
import threading

import grpc
import numpy as np
import pytest
from grpc import aio

from protos import messages, pb, pb_grpc, wire
from protos.channels import SERVICE_NAME, channel_options
from protos.errors import InvalidInput
from proxy.transport.failures import CallFailed
from proxy.transport.streams import StreamPool
from tests.proxy.scripted import ScriptedModel, affine, serve
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post
from v2server import metrics
from v2server.dataplane import DataPlane
from v2server.registry import Registry
from v2server.server import V2Server
from v2server.servicer import InferenceServicer
from v2server.settings import ServerSettings

STREAMS = pytest.mark.parametrize("transport", ["stream"])
PIPES = {"p": pipeline([call("a", "plus1", "parse")], {"y": "a.y[0]"})}


def answered(method: str, model: str) -> float:
    return metrics.REQUESTS.labels(method, model, "OK")._value.get()


@STREAMS
async def test_calls_travel_on_streams(make_client) -> None:
    parse, models = await serve(parse_model()), await serve(affine("plus1", 1, 1))
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{models.port}"}
    streamed, unary = answered("ModelStreamInfer", "plus1"), answered("ModelInfer", "plus1")
    try:
        async with make_client(PIPES, env) as client:
            answers = await asyncio.gather(*(post(client, "p", body(i)) for i in range(20)))
    finally:
        await parse.stop(0)
        await models.stop(0)
    assert [a.json()["result"] for a in answers] == [{"y": [i + 1.0]} for i in range(20)]
    assert answered("ModelStreamInfer", "plus1") - streamed == 20
    assert answered("ModelInfer", "plus1") == unary


class UnaryOnly:
    """A v2 server without ModelStreamInfer (as some servers are): UNIMPLEMENTED."""

    def __init__(self, model: ScriptedModel) -> None:
        self.plane = DataPlane(Registry.of(model), server_name="unary-only", server_version="0")
        self.servicer = InferenceServicer(self.plane)
        self.infer_calls = 0

    async def _infer(self, request: wire.ParsedInferRequest, context: aio.ServicerContext):
        self.infer_calls += 1
        return await self.servicer.ModelInfer(request, context)

    async def start(self) -> int:
        handlers = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                self._infer,
                request_deserializer=wire.parse_infer_request,
                response_serializer=wire.serialize_response,
            ),
            "ServerMetadata": grpc.unary_unary_rpc_method_handler(
                self.servicer.ServerMetadata,
                request_deserializer=pb.ServerMetadataRequest.FromString,
                response_serializer=pb.ServerMetadataResponse.SerializeToString,
            ),
        }
        self.server = aio.server()
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.plane.registry.start()
        await self.server.start()
        return port


@STREAMS
async def test_a_server_without_streams_is_called_unary(make_client) -> None:
    parse = await serve(parse_model())
    unary = UnaryOnly(affine("plus1", 1, 1))
    port = await unary.start()
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{port}"}
    try:
        async with make_client(PIPES, env) as client:
            first = await post(client, "p", body(1))
            rest = await asyncio.gather(*(post(client, "p", body(i)) for i in range(5)))
    finally:
        await parse.stop(0)
        await unary.server.stop(0)
    assert first.status_code == 200 and first.json()["result"] == {"y": [2.0]}
    assert [r.json()["result"] for r in rest] == [{"y": [i + 1.0]} for i in range(5)]
    assert unary.infer_calls == 6, "each request once, unary, after one refused stream"


@STREAMS
async def test_a_dying_server_fails_only_what_was_in_flight_then_a_new_stream_works(
    make_client,
) -> None:
    parse = await serve(parse_model())
    slow = affine("plus1", 1, 1, delay_s=0.5)
    models = await serve(slow)
    port = models.port
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{port}"}
    try:
        async with make_client(PIPES, env) as client:
            warm = await post(client, "p", body(0))
            in_flight = [asyncio.ensure_future(post(client, "p", body(i))) for i in range(6)]
            await asyncio.sleep(0.2)
            await models.stop(0)  # the stream breaks under six requests
            broken = await asyncio.gather(*in_flight)
            models = await serve(affine("plus1", 1, 1), port=port)
            # The channel reconnects on its backoff (PROXY: at most 1 s after the failed
            # attempts above); a request inside that window may still get 503.
            back_since = asyncio.get_running_loop().time()
            while (back := await post(client, "p", body(7))).status_code == 503:
                assert asyncio.get_running_loop().time() - back_since < 2.0, back.text
                await asyncio.sleep(0.05)
    finally:
        await parse.stop(0)
        await models.stop(0)
    assert warm.status_code == 200
    assert [r.status_code for r in broken] == [503] * 6, [r.text for r in broken]
    assert all(r.json()["step"] == "a" for r in broken)
    assert back.status_code == 200 and back.json()["result"] == {"y": [8.0]}, back.text


@STREAMS
async def test_a_streamed_error_keeps_its_status(make_client) -> None:
    """Our services put the status beside the stream's error_message: a bad input is 400
    on a stream as on a unary call (not the 502 an unknown error would get)."""

    async def picky(inputs, deadline):
        raise InvalidInput("x must be positive")

    parse, models = await serve(parse_model()), await serve(ScriptedModel("plus1", picky))
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{models.port}"}
    try:
        async with make_client(PIPES, env) as client:
            r = await post(client, "p", body(-1))
    finally:
        await parse.stop(0)
        await models.stop(0)
    assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT"
    assert "x must be positive" in r.json()["error"]


async def test_a_draining_server_ends_its_idle_streams_itself() -> None:
    """A graceful stop ends each open stream once its requests are answered (status OK),
    instead of waiting for the caller until the grace runs out and cancelling it."""
    models = await serve(affine("plus1", 1, 1), grace_s=30)
    channel = aio.insecure_channel(f"127.0.0.1:{models.port}")
    pool = StreamPool(channel, 1)
    stream = pool.pick()
    key = pool.key("r")
    request = messages.build_request_bytes(
        "plus1", {"x": np.ones((1, 2), np.float32)}, request_id=key
    )
    answer = await stream.infer(key, request, 5)
    stopping = asyncio.ensure_future(models.stop())
    status = await stream._call.code()
    # The call's status can be known a loop turn before the stream's reader sees the end.
    await asyncio.wait_for(stream._reader, 5)
    await stopping
    await channel.close()
    assert messages.response_outputs(answer)["y"].tolist() == [[2.0, 2.0]]
    assert status == grpc.StatusCode.OK and stream.closed


async def test_a_server_still_loading_its_models_says_unavailable_not_unknown() -> None:
    """The port opens before the models load (so health can say NOT_SERVING): a call that
    arrives meanwhile is UNAVAILABLE, which callers retry, not NOT_FOUND, which they
    pass on as 404 (a restarted predictor answered one request 404 under load)."""
    loading, release = threading.Event(), threading.Event()

    def load():
        loading.set()
        release.wait(10)
        return [affine("plus1", 1, 1)]

    server = V2Server(
        Registry(load),
        ServerSettings(port=0, grace_s=0, linger_s=0),
        server_name="s",
        server_version="0",
    )
    starting = asyncio.ensure_future(server.start())
    assert await asyncio.to_thread(loading.wait, 10)
    channel = aio.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    request = messages.build_request("plus1", {"x": np.ones((1, 2), np.float32)})
    try:
        with pytest.raises(aio.AioRpcError) as unary:
            await stub.ModelInfer(request, timeout=5)
        pool = StreamPool(channel, 1)
        key = pool.key("r")
        raw = messages.build_request_bytes(
            "plus1", {"x": np.ones((1, 2), np.float32)}, request_id=key
        )
        with pytest.raises(CallFailed) as streamed:
            await pool.pick().infer(key, raw, 5)
        ready_early = await stub.ModelReady(pb.ModelReadyRequest(name="plus1"), timeout=5)
        release.set()
        await starting
        answer = await stub.ModelInfer(request, timeout=5)
    finally:
        release.set()
        await channel.close()
        await server.stop(0)
    assert unary.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "still loading" in unary.value.details()
    assert streamed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "still loading" in streamed.value.details()
    assert not ready_early.ready
    assert messages.response_outputs(answer)["y"].tolist() == [[2.0, 2.0]]


async def test_requests_that_leave_mid_write_do_not_break_the_stream_they_share() -> None:
    """Big requests (their writes wait on HTTP/2 flow control) whose callers give up after a
    millisecond or hang up, on the one stream that also carries small requests: the leavers
    fail alone; every neighbour is answered, on the same stream (a cancellation inside
    grpc.aio's write() once cancelled the whole call)."""
    models = await serve(affine("plus1", 1, 1), max_message_mb=64)
    channel = aio.insecure_channel(f"127.0.0.1:{models.port}", options=channel_options(64))
    pool = StreamPool(channel, 1)
    stream = pool.pick()
    big = np.ones((1, 2 << 20), np.float32)  # 8 MiB

    def request(x: np.ndarray) -> tuple[str, bytes]:
        key = pool.key("r")
        return key, messages.build_request_bytes("plus1", {"x": x}, request_id=key)

    async def one(prepared: tuple[str, bytes], timeout: float = 10.0) -> np.ndarray:
        answer = await stream.infer(*prepared, timeout)
        return messages.response_outputs(answer)["y"]

    async def hang_up(prepared: tuple[str, bytes]) -> None:
        task = asyncio.ensure_future(one(prepared))
        await asyncio.sleep(0.0005)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    try:
        for round_ in range(6):
            # Built beforehand: building takes longer than the leavers' budgets.
            leaver = request(big)
            small = [request(np.full((1, 2), round_ * 10 + i, np.float32)) for i in range(10)]
            leave = one(leaver, timeout=0.001) if round_ % 2 else hang_up(leaver)
            results = await asyncio.gather(leave, *(one(p) for p in small), return_exceptions=True)
            if round_ % 2:
                assert isinstance(results[0], CallFailed)
                assert results[0].code() == grpc.StatusCode.DEADLINE_EXCEEDED
            failed = [a for a in results[1:] if isinstance(a, Exception)]
            assert not failed, failed
            assert [a[0, 0] for a in results[1:]] == [round_ * 10 + i + 1.0 for i in range(10)]
        assert pool.pick() is stream and not stream.closed
    finally:
        await pool.close()
        await channel.close()
        await models.stop(0)


class OneShotStreams(UnaryOnly):
    """A v2 server whose ModelStreamInfer carries `answers` requests (one by default) and
    ends, whatever was sent after them: it answers and closes (`wrapped`), or, as MLServer
    1.7 does, sends a bare ModelInferResponse on the stream instead of a
    ModelStreamInferResponse and closes."""

    def __init__(self, model: ScriptedModel, wrapped: bool, answers: int = 1) -> None:
        super().__init__(model)
        self.wrapped = wrapped
        self.answers = answers
        self.streams = 0
        self.streamed = 0

    async def _stream(self, requests, context: aio.ServicerContext):
        self.streams += 1
        answered = 0
        async for request in requests:
            answer = await self.servicer.ModelInfer(request, context)
            yield wire.stream_response(answer) if self.wrapped else answer
            answered += 1
            self.streamed += 1
            if answered == self.answers:
                return

    async def start(self) -> int:
        port = await super().start()
        handler = grpc.stream_stream_rpc_method_handler(
            self._stream,
            request_deserializer=wire.parse_infer_request,
            response_serializer=wire.serialize_response,
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, {"ModelStreamInfer": handler}),)
        )
        return port


@STREAMS
@pytest.mark.parametrize("wrapped", [True, False], ids=["answers-once", "mlserver-like"])
async def test_a_server_whose_streams_carry_one_request_is_called_unary(
    make_client, wrapped: bool
) -> None:
    """Learnt from the streams themselves (one that ends with requests outstanding, answers
    without the request's id, or ends after one answer twice running), and no request fails
    for it: those in flight on the failed stream are sent again, unary."""
    parse = await serve(parse_model())
    one_shot = OneShotStreams(affine("plus1", 1, 1, delay_s=0.01), wrapped)
    port = await one_shot.start()
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{port}"}
    try:
        async with make_client(PIPES, env) as client:
            first = await asyncio.gather(*(post(client, "p", body(i)) for i in range(8)))
            later = [await post(client, "p", body(i)) for i in range(4)]
    finally:
        await parse.stop(0)
        await one_shot.server.stop(0)
    assert [r.status_code for r in first + later] == [200] * 12, [r.text for r in first]
    assert [r.json()["result"] for r in first] == [{"y": [i + 1.0]} for i in range(8)]
    assert [r.json()["result"] for r in later] == [{"y": [i + 1.0]} for i in range(4)]
    assert one_shot.streams <= 4, "it kept opening streams"
    assert one_shot.infer_calls >= 4, "the later requests went unary"


@STREAMS
async def test_requests_a_stream_ends_under_after_many_answers_are_sent_again(
    make_client,
) -> None:
    """A stream that carried many requests and ended with some outstanding (a draining
    server ends its streams so, and a request may cross the end on the wire): those are sent
    again unary, nothing fails, and the address stays on streams (it once went unary for
    good, after every rolling restart that raced a request)."""
    parse = await serve(parse_model())
    capped = OneShotStreams(affine("plus1", 1, 1, delay_s=0.01), wrapped=True, answers=3)
    port = await capped.start()
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{port}"}
    try:
        async with make_client(PIPES, env) as client:
            first = await asyncio.gather(*(post(client, "p", body(i)) for i in range(8)))
            resent, streamed = capped.infer_calls, capped.streamed
            later = [await post(client, "p", body(i)) for i in range(2)]
    finally:
        await parse.stop(0)
        await capped.server.stop(0)
    assert [r.status_code for r in first + later] == [200] * 10, [r.text for r in first]
    assert [r.json()["result"] for r in first + later] == [
        {"y": [i + 1.0]} for i in [*range(8), *range(2)]
    ]
    assert resent >= 1, "the requests the stream ended under were sent again, unary"
    assert capped.streamed - streamed == 2 and capped.infer_calls == resent, "still streams"


async def test_a_draining_stream_answers_the_requests_it_has_read() -> None:
    """A request read from a stream but still waiting for room (its stream's byte window is
    full) when the server drains gets an answer before the stream ends: UNAVAILABLE, which
    the proxy retries elsewhere (the stream used to end as soon as nothing was running, with
    the request unanswered, and the proxy then called the address unary for good)."""
    models = await serve(
        affine("plus1", 1, 1, delay_s=0.3), grace_s=30, stream_window_mb=1e-6
    )  # a window of one byte: one request at a time
    channel = aio.insecure_channel(f"127.0.0.1:{models.port}")
    pool = StreamPool(channel, 1)
    stream = pool.pick()
    keys = [pool.key("a"), pool.key("b")]
    x = np.ones((1, 2), np.float32)
    calls = [
        asyncio.ensure_future(
            stream.infer(k, messages.build_request_bytes("plus1", {"x": x}, request_id=k), 5)
        )
        for k in keys
    ]
    try:
        await asyncio.sleep(0.1)  # both written: the first runs, the second waits for room
        stopping = asyncio.ensure_future(models.stop())
        first, second = await asyncio.gather(*calls, return_exceptions=True)
        status = await stream._call.code()
        await stopping
    finally:
        await channel.close()
    assert messages.response_outputs(first)["y"].tolist() == [[2.0, 2.0]]
    assert isinstance(second, CallFailed), second
    assert second.code() == grpc.StatusCode.UNAVAILABLE and not second.stream, second
    assert "shutting down" in second.details()
    assert status == grpc.StatusCode.OK and pool.unfit == ""


async def test_a_stream_opened_on_a_draining_server_is_refused_and_streams_stay() -> None:
    """A stream opened while the server drains is refused UNAVAILABLE, like a unary call (the
    caller retries elsewhere), and the address stays on streams: it used to end at once with
    status OK and the request unread, which taught the proxy to call the address unary for
    good, after every graceful restart under load."""
    started, release = asyncio.Event(), asyncio.Event()

    async def held(inputs, deadline):  # runs until the late stream has been refused
        started.set()
        await release.wait()
        return {"y": inputs["x"] + 1}

    models = await serve(ScriptedModel("plus1", held), grace_s=30)
    channel = aio.insecure_channel(f"127.0.0.1:{models.port}")
    pool = StreamPool(channel, 2)
    x = np.ones((1, 2), np.float32)

    def request(key: str) -> bytes:
        return messages.build_request_bytes("plus1", {"x": x}, request_id=key)

    try:
        first = pool.key("a")
        running = asyncio.ensure_future(pool.pick().infer(first, request(first), 10))
        # The first request must be running at the server before the stop: with nothing in
        # flight the stop goes straight to grpc's own, whose refusal is core's, not ours.
        await asyncio.wait_for(started.wait(), 10)
        stopping = asyncio.ensure_future(models.stop())
        await asyncio.sleep(0)  # the stop marks the server draining before its first wait
        assert models.plane.draining
        late = pool.key("b")
        try:
            with pytest.raises(CallFailed) as refused:
                await pool.pick().infer(late, request(late), 5)  # the pool's second stream
        finally:
            release.set()
        answer = await running
        await stopping
    finally:
        await channel.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    assert "shutting down" in refused.value.details()
    assert not refused.value.unfit and not refused.value.resend and pool.unfit == ""
    assert messages.response_outputs(answer)["y"].tolist() == [[2.0, 2.0]]


async def test_streams_a_draining_server_ends_teach_nothing() -> None:
    """Two streams that answered one request each, ended by a graceful stop: the server says
    it drained them (trailing metadata), so the proxy does not take them for a server whose
    streams carry one request each (twice running made the address unary for good)."""
    models = await serve(affine("plus1", 1, 1), grace_s=30)
    channel = aio.insecure_channel(f"127.0.0.1:{models.port}")
    pool = StreamPool(channel, 2)
    x = np.ones((1, 2), np.float32)
    try:
        streams = []
        for name in ("a", "b"):
            key = pool.key(name)
            stream = pool.pick()
            request = messages.build_request_bytes("plus1", {"x": x}, request_id=key)
            await stream.infer(key, request, 5)
            streams.append(stream)
        await models.stop()
        codes = [await s._call.code() for s in streams]
        # each stream's reader has seen its end (the status can come a loop turn earlier)
        await asyncio.wait_for(asyncio.gather(*(s._reader for s in streams)), 5)
    finally:
        await channel.close()
    assert len({id(s) for s in streams}) == 2, "two streams, one answer each"
    assert codes == [grpc.StatusCode.OK] * 2 and all(s.closed for s in streams)
    assert pool.unfit == "" and pool.short_lived == 0


def _big_buffers_held(over: int) -> list[str]:
    """Buffers over `over` bytes that some live object refers to, by that object's type."""
    import gc

    gc.collect()
    held = []
    for owner in gc.get_objects():
        for ref in gc.get_referents(owner):
            size = ref.nbytes if isinstance(ref, (memoryview, np.ndarray)) else -1
            size = len(ref) if isinstance(ref, (bytes, bytearray)) else size
            if size > over:
                held.append(type(owner).__name__)
    return held


@STREAMS
async def test_an_idle_stream_holds_no_request_or_answer(make_client) -> None:
    # Every idle stream, at both ends, kept its last request and answer until its next: after
    # a crowd of OCR photos (up to 20 MiB each), ~140 MiB in a proxy, more in the services.
    parse, models = await serve(parse_model()), await serve(affine("plus1", 1, 1))
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{models.port}"}
    try:
        async with make_client(PIPES, env) as client:
            data = body(*range(600_000))  # 2.4 MB, and as much again at every hop
            answer = await post(client, "p", data)
            assert answer.json()["result"]["y"][:3] == [1.0, 2.0, 3.0]
            del data, answer
            held = _big_buffers_held(2_000_000)
    finally:
        await parse.stop(0)
        await models.stop(0)
    assert held == []
