"""An endpoint that answers nothing, not even a readiness check, has its calls fail at once
until it answers again (proxy/transport/breaker.py): the rules on their own, then real gRPC
calls to a port that accepts connections and never speaks, later a real v2 server."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

from protos import pb
from proxy.engine.cache.fingerprints import Fingerprints
from proxy.errors import StepError
from proxy.transport import breaker as breakers
from proxy.transport.breaker import Breaker
from proxy.transport.calls import Call, Calls, infer_with_retries
from proxy.transport.catalog import Catalog
from proxy.transport.channels import Channels
from proxy.transport.services import Services
from proxy.transport.target import Target
from tests.proxy.scripted import affine, serve
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post

UNAVAILABLE, DEADLINE = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED


class Checks:
    """A readiness check whose answer the test sets, counting how often it is asked."""

    def __init__(self) -> None:
        self.ready = False
        self.asked = 0

    async def __call__(self, address: str, model: str, timeout: float) -> tuple[bool, str]:
        self.asked += 1
        return self.ready, "" if self.ready else "DEADLINE_EXCEEDED: Deadline Exceeded"


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def _sent(breaker: Breaker, ago_s: float = 1.0) -> int:
    """A call that left `ago_s` ago (its token)."""
    token = breaker.sending("m")
    breaker.started[token] -= ago_s
    return token


async def test_calls_without_an_answer_and_an_unanswered_check_refuse_calls_until_one_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(breakers, "CHECK_EVERY_S", 0.01)
    checks = Checks()
    breaker = Breaker("10.0.0.9:8001", checks)
    first, second, third = (_sent(breaker) for _ in range(3))
    breaker.missed(first, DEADLINE, "Deadline Exceeded", "m")
    breaker.missed(second, DEADLINE, "Deadline Exceeded", "m")
    await _settle()
    assert checks.asked == 0 and not breaker.refusing, "two misses are not enough"
    breaker.missed(third, DEADLINE, "Deadline Exceeded", "m")
    await _settle()
    assert checks.asked == 1 and breaker.refusing
    assert "10.0.0.9:8001 is not answering" in breaker.refusal()
    assert "DEADLINE_EXCEEDED" in breaker.refusal()
    await asyncio.sleep(0.05)
    assert checks.asked > 1 and breaker.refusing, "asked again while unanswered"
    checks.ready = True
    await asyncio.sleep(0.05)
    assert not breaker.refusing and breaker.misses == 0
    asked = checks.asked
    await asyncio.sleep(0.05)
    assert checks.asked == asked, "no check once it answers"


async def test_a_call_out_for_a_stall_has_its_endpoint_checked_before_it_ends() -> None:
    """A frozen process's calls may end only at their deadline, and a closed loop of
    clients sends no other call meanwhile: a call out for a stall, with no answer since it
    left, has the endpoint checked by itself."""
    checks = Checks()
    breaker = Breaker("a:1", checks)
    breaker.answered(breaker.sending("m"))  # answered in ~0 s: a stall is STALL_S
    breaker.sending("m")
    await asyncio.sleep(breakers.STALL_S / 2)
    assert checks.asked == 0, "out for less than a stall"
    await asyncio.sleep(breakers.STALL_S / 2 + 0.05)
    assert checks.asked == 1 and breaker.refusing
    assert "still out" in breaker.refusal()


async def test_an_endpoint_that_answers_its_check_keeps_its_calls() -> None:
    """Calls out of time on a live endpoint (slow for their budgets): it is checked, it
    answers, nothing is refused."""
    checks = Checks()
    checks.ready = True
    breaker = Breaker("a:1", checks)
    for _ in range(3):
        breaker.missed(_sent(breaker), DEADLINE, "Deadline Exceeded", "m")
    await _settle()
    assert checks.asked == 1 and not breaker.refusing and breaker.misses == 0


async def test_what_does_not_count_as_a_miss() -> None:
    checks = Checks()
    breaker = Breaker("a:1", checks)
    for _ in range(5):  # a client's budget of a few milliseconds says nothing of the endpoint
        breaker.missed(breaker.sending("m"), DEADLINE, "Deadline Exceeded", "m")
    assert breaker.misses == 0
    refused = [_sent(breaker) for _ in range(5)]
    for token in refused:  # gRPC fails these at once; a retry may find it restarted
        breaker.missed(token, UNAVAILABLE, "connection refused", "m")
    assert breaker.misses == 0
    early = [_sent(breaker) for _ in range(4)]
    breaker.missed(early[0], DEADLINE, "Deadline Exceeded", "m")
    breaker.missed(early[1], DEADLINE, "Deadline Exceeded", "m")
    breaker.missed(early[2], grpc.StatusCode.INVALID_ARGUMENT, "bad input", "m")
    assert breaker.misses == 0, "an error is an answer"
    breaker.missed(early[3], DEADLINE, "x", "m")  # sent before the endpoint last answered
    assert breaker.misses == 0 and len(breaker.started) == 0
    await _settle()
    assert checks.asked == 0


class Sink:
    """A port that accepts connections and reads them, never saying a word (a process
    frozen, a port that is no gRPC server); closed, it drops them as a dying process does."""

    async def start(self) -> int:
        self.writers: list[asyncio.StreamWriter] = []
        self.closed = False
        self.server = await asyncio.start_server(self._swallow, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _swallow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A connection accepted as the sink closes reaches here after close() ran: dropped
        # at once, and every connection dropped when its caller leaves. Left half-open, one
        # was collected up to gRPC's 20 s handshake later, in another module's test (CI).
        self.writers.append(writer)
        try:
            while not self.closed and await reader.read(65536):
                pass
        finally:
            writer.transport.abort()

    async def close(self) -> None:
        self.closed = True
        # No more accepted, then a few turns for those already accepted to get their
        # transports: CPython 3.11 leaks the socket of one whose transport is made after
        # the server's close().
        loop = asyncio.get_running_loop()
        for sock in self.server.sockets:
            loop.remove_reader(sock.fileno())
        for _ in range(4):
            await asyncio.sleep(0)
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self.server.wait_closed()


def _calls_to(
    port: int, streams: int, merge: bool = False, model: str = "affine"
) -> tuple[Channels, Calls, Call]:
    """This process's calls (real channels) and one step's call to a model at `port`."""
    channels = Channels(streams=streams)
    calls = Calls(channels, Services(channels), merge=merge)
    return channels, calls, Call("m", Target("M_URL", f"127.0.0.1:{port}", model), ["y"], None, 0)


@pytest.mark.parametrize("streams", [2, 0], ids=["streams", "unary"])
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "alone"])
async def test_a_silent_endpoint_fails_calls_at_once_then_serves_once_it_answers(
    monkeypatch: pytest.MonkeyPatch, streams: int, merge: bool
) -> None:
    monkeypatch.setattr(breakers, "CHECK_TIMEOUT_S", 0.3)
    monkeypatch.setattr(breakers, "CHECK_EVERY_S", 0.05)
    sink = Sink()
    port = await sink.start()
    channels, calls, call = _calls_to(port, streams, merge)
    x = {"x": np.ones((1, 2), np.float32)}
    loop = asyncio.get_running_loop()
    try:
        t0 = time.monotonic()
        with pytest.raises(StepError) as failed:
            await calls.call(call, x, loop.time() + 0.4, "r")
        assert failed.value.code == DEADLINE and time.monotonic() - t0 > 0.35
        await asyncio.sleep(0.3)  # checked while that call was out: the check goes unanswered
        t0 = time.monotonic()
        with pytest.raises(StepError) as refused:
            await calls.call(call, x, loop.time() + 5.0, "r")
        assert time.monotonic() - t0 < 0.2, "refused at once, not after its 5 s budget"
        assert refused.value.code == UNAVAILABLE
        assert f"127.0.0.1:{port} is not answering" in refused.value.message
        await sink.close()
        server = await serve(affine("affine", 2.0, 1.0), port=port)
        try:
            answered = None
            give_up = time.monotonic() + 10
            while answered is None and time.monotonic() < give_up:
                try:
                    answered = await calls.call(call, x, loop.time() + 2.0, "r")
                except StepError as exc:
                    assert exc.code == UNAVAILABLE, exc
                    await asyncio.sleep(0.05)
            assert answered is not None, "the endpoint answers again: its calls go out"
            assert np.asarray(answered["y"]).tolist() == [[3.0, 3.0]]
        finally:
            await server.stop(0)
    finally:
        await sink.close()
        await channels.close()


class SilentMetadata:
    """Services.metadata of an endpoint that answers nothing until `answers` is set."""

    def __init__(self) -> None:
        self.asked = 0
        self.answers = False

    async def metadata(self, address: str, model: str, version: str, timeout: float):
        self.asked += 1
        if self.answers:
            return pb.ModelMetadataResponse(name=model, versions=["1"], platform="onnx")
        await asyncio.sleep(timeout)
        raise TimeoutError

    async def config(self, address: str, model: str, version: str, timeout: float):
        if self.answers:
            return pb.ModelConfigResponse(config=pb.ModelConfig(name=model))
        await asyncio.sleep(timeout)
        raise TimeoutError


async def test_a_cache_key_waits_once_for_a_model_that_cannot_say_its_fingerprint() -> None:
    """A cached pipeline's key covers each model's metadata; a model that answers nothing
    made every request wait the ask's timeout (0.5 s a `digits-partial` request while a
    branch was frozen). Now only the first waits; it is asked again once per check_s, in
    the background."""
    services = SilentMetadata()
    prints = Fingerprints(Catalog(services, check_s=0.2, timeout_s=0.3))  # type: ignore[arg-type]
    target = Target("M_URL", "10.0.0.9:1", "m")
    t0 = time.monotonic()
    assert await prints.of(target) is None
    assert time.monotonic() - t0 >= 0.29 and services.asked == 1
    t0 = time.monotonic()
    for _ in range(20):
        assert await prints.of(target) is None
    assert time.monotonic() - t0 < 0.1 and services.asked == 1, "asked once per check_s"
    await asyncio.sleep(0.2)
    services.answers = True
    t0 = time.monotonic()
    assert await prints.of(target) is None, "not waited for"
    assert time.monotonic() - t0 < 0.1
    await asyncio.sleep(0.05)  # the ask in the background: metadata and config together
    assert services.asked == 2
    assert await prints.of(target) is not None, "its fingerprint once it answers"


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "alone"])
async def test_a_cancelled_call_leaves_no_record(merge: bool) -> None:
    """A call its caller cancels (a client gone) is forgotten, neither answer nor miss:
    the endpoint's record of calls out would otherwise grow with every hang-up."""
    server = await serve(affine("slow", 1.0, 0.0, delay_s=10.0))
    channels, calls, call = _calls_to(server.port, 2, merge, model="slow")
    loop = asyncio.get_running_loop()
    try:
        tasks = [
            asyncio.ensure_future(
                calls.call(call, {"x": np.ones((1, 2), np.float32)}, loop.time() + 30, f"r{i}")
            )
            for i in range(4)
        ]
        await asyncio.sleep(0.3)
        breaker = calls.breakers.get(call.target.address)
        assert len(breaker.started) == 4
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert breaker.started == {} and breaker.misses == 0 and not breaker.refusing
    finally:
        await channels.close()
        await server.stop(0)


@pytest.mark.parametrize("streams", [2, 0], ids=["streams", "unary"])
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "alone"])
async def test_calls_out_when_an_endpoint_is_found_silent_fail_then_not_at_their_deadline(
    monkeypatch: pytest.MonkeyPatch, streams: int, merge: bool
) -> None:
    """A frozen process's calls would hold their requests for their whole budget (15 s for
    an OCR page): once the check goes unanswered they fail at once, and the tasks that made
    them go on as tasks that were never cancelled."""
    monkeypatch.setattr(breakers, "CHECK_TIMEOUT_S", 0.3)
    sink = Sink()
    port = await sink.start()
    channels, calls, call = _calls_to(port, streams, merge)
    loop = asyncio.get_running_loop()

    async def one(i: int) -> tuple[str, float, bool]:
        t0 = time.monotonic()
        try:
            await calls.call(call, {"x": np.ones((1, 2), np.float32)}, loop.time() + 10, f"r{i}")
        except StepError as exc:
            outcome = f"{exc.code.name}: {exc.message}"
        waited = time.monotonic() - t0
        await asyncio.sleep(0.01)  # raises CancelledError if the task were left cancelled
        task = asyncio.current_task()
        return outcome, waited, task is not None and task.cancelling() == 0

    try:
        results = await asyncio.gather(*(one(i) for i in range(4)))
    finally:
        await sink.close()
        await channels.close()
    for outcome, waited, clean in results:
        assert outcome.startswith("UNAVAILABLE") and "is not answering" in outcome, outcome
        assert waited < 3.0, "let go once the endpoint was found silent, not at 10 s"
        assert clean
    assert calls.breakers.get(call.target.address).waiting == {}


async def test_a_call_let_go_whose_caller_is_cancelled_too_stays_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The breaker's cancellation is taken back, never the caller's own."""
    monkeypatch.setattr(breakers, "CHECK_TIMEOUT_S", 0.3)
    sink = Sink()
    port = await sink.start()
    channels, calls, call = _calls_to(port, 0)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(
        calls.call(call, {"x": np.ones((1, 2), np.float32)}, loop.time() + 10, "r")
    )
    breaker = calls.breakers.get(call.target.address)
    try:
        for _ in range(500):  # until the call is out
            if breaker.waiting:
                break
            await asyncio.sleep(0.01)
        task.cancel()  # the caller's own, then the breaker's (same loop turn)
        breaker._release()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await sink.close()
        await channels.close()


async def test_the_v2_doors_forwards_fail_at_once_too(
    monkeypatch: pytest.MonkeyPatch, servers, make_client
) -> None:
    """A model a pipeline calls, asked for by name on the v2 door, is forwarded to its
    service: once the pipelines' calls found that service not answering, so do these."""
    monkeypatch.setattr(breakers, "CHECK_TIMEOUT_S", 0.3)
    sink = Sink()
    port = await sink.start()
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": f"127.0.0.1:{port}"}
    pipes = {"p": pipeline([call("a", "affine", "parse")], {"y": "a.y[0]"})}
    x = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
    try:
        async with make_client(pipes, env) as client:
            slow = await post(client, "p", body(1), **{"X-Request-Timeout-Ms": "400"})
            assert slow.status_code == 504, slow.text
            await asyncio.sleep(0.4)  # the check goes unanswered
            t0 = time.monotonic()
            refused = await post(client, "p", body(1), **{"X-Request-Timeout-Ms": "5000"})
            door = await client.post("/v2/models/affine/infer", json={"inputs": [x]})
            waited = time.monotonic() - t0
    finally:
        await sink.close()
    assert refused.status_code == 503 and "is not answering" in refused.json()["error"]
    assert door.status_code == 503 and "is not answering" in door.json()["error"], door.text
    assert waited < 1.0, "both failed at once, not at their budgets"


async def test_a_call_let_go_whose_layer_below_fails_otherwise_leaves_its_task_uncancelled() -> (
    None
):
    """A layer below may answer the breaker's cancellation with an error of its own: that
    error is the call's, and the cancellation is still taken back, or it would cancel the
    request at its next await."""
    breaker = Breaker("a:1", Checks())
    call = Call("m", Target("M_URL", "a:1", "m"), ["y"], None, 0)
    waiting = asyncio.Event()

    async def converts(target, inputs, *, outputs, timeout, request_id):
        waiting.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise StepError("m", grpc.StatusCode.INTERNAL, "the layer's own failure") from None
        raise AssertionError("not let go")

    async def caller() -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        try:
            await infer_with_retries(None, call, {}, loop.time() + 10, "r", converts, breaker)  # type: ignore[arg-type]
        except StepError as exc:
            outcome = exc.message
        await asyncio.sleep(0.01)  # raises CancelledError if the task were left cancelled
        return outcome, asyncio.current_task().cancelling()  # type: ignore[union-attr]

    task = asyncio.ensure_future(caller())
    await waiting.wait()
    breaker._release()
    assert await task == ("the layer's own failure", 0)
