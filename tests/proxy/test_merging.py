"""Caller-side batching (proxy/transport/merging.py) against real gRPC servers: requests in flight
together reach a batching model in fewer calls, each still gets its own rows, its own error
and its own deadline; a model that does not batch is never sent merged calls."""

from __future__ import annotations

import asyncio
import gc

import grpc
import numpy as np
import pytest

from protos.errors import InvalidInput
from proxy import metrics
from proxy.transport.failures import CallFailed
from proxy.transport.members import HALVED, HALVED_DECLARED
from tests.proxy.scripted import ScriptedModel, serve
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post
from v2server.model import Scheduling

MERGED = pytest.mark.parametrize("transport", ["stream", "unary"])
PIPES = {"p": pipeline([call("a", "plus1", "parse")], {"y": "a.y"})}


def plus1(max_batch: int, delay_s: float = 0.05, bad: float | None = None) -> ScriptedModel:
    """y = x + 1, after `delay_s`; rows of each call recorded; a row equal to `bad` makes the
    whole call INVALID_ARGUMENT (as a model refuses a batch with one bad row)."""
    rows: list[int] = []
    refused: list[int] = []

    async def fn(inputs, deadline):
        x = inputs["x"]
        rows.append(x.shape[0])
        await asyncio.sleep(delay_s)
        if bad is not None and (x == bad).any():
            refused.append(x.shape[0])
            raise InvalidInput(f"x may not be {bad}")
        return {"y": (x + 1).astype(np.float32)}

    model = ScriptedModel("plus1", fn, scheduling=Scheduling(max_batch_size=max_batch))
    model.rows = rows  # type: ignore[attr-defined]
    model.refused = refused  # type: ignore[attr-defined]
    return model


async def _run(
    make_client,
    model: ScriptedModel,
    requests: list[tuple[bytes, dict]],
    answered_at: list[float] | None = None,
):
    """The requests' answers, in order; `answered_at` gets when each came (loop time)."""
    parse, models = await serve(parse_model()), await serve(model)
    env = {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{models.port}"}
    loop = asyncio.get_running_loop()

    async def one(client, i: int, blob: bytes, headers: dict):
        answer = await post(client, "p", blob, **headers)
        if answered_at is not None:
            answered_at[i] = loop.time()
        return answer

    try:
        async with make_client(PIPES, env, merge=True) as client:
            await post(client, "p", body(0.0))  # learns the model's max_batch_size
            model.rows.clear()  # type: ignore[attr-defined]
            if answered_at is not None:
                answered_at[:] = [0.0] * len(requests)
            return await asyncio.gather(*(one(client, i, *r) for i, r in enumerate(requests)))
    finally:
        await parse.stop(0)
        await models.stop(0)


def _members() -> tuple[float, float]:
    """(merged calls, members in them) of the step, from the proxy's histogram."""
    samples = {
        s.name: s.value
        for s in metrics.MERGED_MEMBERS.collect()[0].samples
        if s.labels.get("step") == "a"
    }
    return samples.get("proxy_merged_call_members_count", 0.0), samples.get(
        "proxy_merged_call_members_sum", 0.0
    )


@MERGED
async def test_requests_in_flight_together_share_calls(make_client) -> None:
    model = plus1(max_batch=64)
    calls_before, members_before = _members()
    answers = await _run(make_client, model, [(body(float(i)), {}) for i in range(24)])
    assert [a.status_code for a in answers] == [200] * 24
    assert [a.json()["result"]["y"] for a in answers] == [[[i + 1.0]] for i in range(24)]
    assert sum(model.rows) == 24  # type: ignore[attr-defined]
    assert len(model.rows) < 12  # type: ignore[attr-defined]
    assert max(model.rows) > 1  # type: ignore[attr-defined]
    calls, members = _members()
    # The warm-up request's call counts too.
    assert members - members_before == 24 + 1
    assert calls - calls_before == len(model.rows) + 1  # type: ignore[attr-defined]


@MERGED
async def test_merged_calls_respect_the_models_batch_size(make_client) -> None:
    model = plus1(max_batch=3)
    answers = await _run(make_client, model, [(body(float(i)), {}) for i in range(16)])
    assert [a.json()["result"]["y"] for a in answers] == [[[i + 1.0]] for i in range(16)]
    assert max(model.rows) == 3  # type: ignore[attr-defined]


@MERGED
async def test_one_bad_member_fails_alone(make_client) -> None:
    model = plus1(max_batch=64, bad=13.0)
    answers = await _run(make_client, model, [(body(float(i)), {}) for i in range(20)])
    statuses = [a.status_code for a in answers]
    assert statuses[13] == 400
    assert "x may not be 13" in answers[13].json()["error"]
    assert statuses[:13] + statuses[14:] == [200] * 19
    good = [a.json()["result"]["y"] for i, a in enumerate(answers) if i != 13]
    assert good == [[[i + 1.0]] for i in range(20) if i != 13]
    # Calls were merged; a merged call holding 13 was refused and sent again by halves until
    # 13 went alone (if 13 happened to leave alone at once, that is its only refusal).
    assert max(model.rows) > 1  # type: ignore[attr-defined]
    refused = model.refused  # type: ignore[attr-defined]
    assert refused[-1] == 1 and refused == sorted(refused, reverse=True)
    assert len(refused) == 1 or refused[0] > 1


@MERGED
async def test_a_deadline_expiring_inside_a_merged_call(make_client) -> None:
    """Short-budget members queue behind busy slots and are merged with long-budget ones;
    the model takes longer than the short budget: those answer 504 at their deadline, before
    any merged call they were in has answered (not held to the latest member's deadline), the
    others get their rows. Told by the order the answers came in, not by a wall-clock bound
    (one of 3 s failed on a slow CI machine)."""
    model = plus1(max_batch=64, delay_s=0.4)
    requests = [
        (body(float(i)), {"X-Request-Timeout-Ms": "250" if i % 2 else "5000"}) for i in range(12)
    ]
    answered_at: list[float] = []
    answers = await _run(make_client, model, requests, answered_at)
    late = [at for at, a in zip(answered_at, answers, strict=True) if a.status_code == 504]
    served = [at for at, a in zip(answered_at, answers, strict=True) if a.status_code == 200]
    assert max(late) < min(served)
    for i, answer in enumerate(answers):
        if i % 2:
            assert answer.status_code == 504, answer.text
        else:
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"]["y"] == [[i + 1.0]]
    assert max(model.rows) > 2  # type: ignore[attr-defined]


@MERGED
async def test_different_shapes_are_never_merged(make_client) -> None:
    model = plus1(max_batch=64)
    requests = [(body(*[float(i)] * (1 + i % 3)), {}) for i in range(18)]
    answers = await _run(make_client, model, requests)
    assert [a.json()["result"]["y"] for a in answers] == [
        [[i + 1.0] * (1 + i % 3)] for i in range(18)
    ]


@MERGED
async def test_a_model_that_does_not_batch_gets_one_call_per_request(make_client) -> None:
    model = plus1(max_batch=0)
    answers = await _run(make_client, model, [(body(float(i)), {}) for i in range(12)])
    assert [a.status_code for a in answers] == [200] * 12
    assert model.rows == [1] * 12  # type: ignore[attr-defined]


async def test_idle_lanes_are_dropped_when_there_are_many(monkeypatch) -> None:
    """A lane per input signature: callers sending ever new sizes must not grow them without
    bound."""
    from proxy.transport import merging
    from proxy.transport.target import Target

    monkeypatch.setattr(merging, "MAX_LANES", 8)

    async def echo(target, inputs, *, outputs, timeout, request_id):
        return {"y": inputs["x"]}

    merger = merging.Merger(echo, 1 << 20)
    target = Target("M_URL", "127.0.0.1:1", "m")
    for width in range(1, 40):
        x = np.zeros((1, width), np.float32)
        lane = merger.lane("a", target, ["y"], {"x": x}, 64)
        answer = await lane.infer(target, {"x": x}, outputs=["y"], timeout=1.0, request_id="r")
        assert answer["y"].shape == (1, width)
    assert len(merger._lanes) <= 8


def _lane(send, halve=HALVED):
    from proxy.transport import merging
    from proxy.transport.target import Target

    target = Target("M_URL", "127.0.0.1:1", "m")
    x = np.zeros((1, 2), np.float32)
    lane = merging.Merger(send, 1 << 20).lane("a", target, ["y"], {"x": x}, 64, halve)

    def infer(value: float, timeout: float = 1.0):
        inputs = {"x": np.full((1, 2), value, np.float32)}
        return lane.infer(target, inputs, outputs=["y"], timeout=timeout, request_id="r")

    return lane, infer


async def test_a_merged_call_cancelled_before_it_starts_frees_its_lane() -> None:
    """Every member leaves in the very turn that creates the merged call (a hang-up, a
    deadline): the call is cancelled before it runs a line, and the lane must still count it
    as ended, or every later request waits its whole budget (the lane once wedged for good)."""
    gate = asyncio.Event()

    async def send(target, inputs, *, outputs, timeout, request_id):
        await gate.wait()
        return {"y": inputs["x"] + 1}

    lane, infer = _lane(send)
    first = asyncio.ensure_future(infer(0.0))
    await asyncio.sleep(0.01)  # in flight alone, holding the lane's slot
    queued = [asyncio.ensure_future(infer(float(i))) for i in (1, 2)]
    await asyncio.sleep(0.01)
    assert len(lane.queue) == 2
    # The first call answers: its ending sends the queue as one merged call, in the turn that
    # also delivers the queued members' cancellations, so they leave before it starts.
    gate.set()
    for task in queued:
        task.cancel()
    assert (await first)["y"][0, 0] == 1.0
    await asyncio.gather(*queued, return_exceptions=True)
    await asyncio.sleep(0.01)
    assert lane.in_flight == 0
    later = await asyncio.wait_for(infer(5.0, timeout=0.5), 1.0)
    assert later["y"][0, 0] == 6.0


async def test_the_first_caller_cancelled_while_gathering_does_not_strand_the_others() -> None:
    async def send(target, inputs, *, outputs, timeout, request_id):
        return {"y": inputs["x"] + 1}

    lane, infer = _lane(send)
    first = asyncio.ensure_future(infer(0.0))
    second = asyncio.ensure_future(infer(1.0))
    await asyncio.sleep(0)  # the idle lane's first caller gathers; the second joins it
    assert len(lane.queue) == 2
    first.cancel()
    answer = await asyncio.wait_for(second, 0.5)
    assert answer["y"][0, 0] == 2.0
    assert first.cancelled()


async def test_a_stalled_call_does_not_hold_up_the_calls_queued_behind_it() -> None:
    """The lane's one call is stuck (a frozen replica): once it has been out several times
    longer than calls usually take, the queue leaves without it, and the stuck call still
    answers its own members if it ever ends."""
    release = asyncio.Event()
    calls: list[int] = []

    async def send(target, inputs, *, outputs, timeout, request_id):
        calls.append(inputs["x"].shape[0])
        if inputs["x"][0, 0] == 100.0:
            await release.wait()
        else:
            await asyncio.sleep(0.002)
        return {"y": inputs["x"] + 1}

    lane, infer = _lane(send)
    for i in range(5):  # the lane learns what a call usually takes
        await infer(float(i))
    stuck = asyncio.ensure_future(infer(100.0, timeout=5.0))
    await asyncio.sleep(0.005)
    loop = asyncio.get_running_loop()
    start = loop.time()
    behind = await asyncio.wait_for(asyncio.gather(*(infer(float(i)) for i in range(6))), 1.0)
    assert loop.time() - start < 0.5  # not the stuck call's 5 s
    assert [a["y"][0, 0] for a in behind] == [i + 1.0 for i in range(6)]
    assert not stuck.done()
    release.set()
    assert (await stuck)["y"][0, 0] == 101.0
    await asyncio.sleep(0.01)
    assert lane.in_flight == 0


@MERGED
async def test_a_bad_member_is_found_by_halves_not_one_call_each(make_client) -> None:
    """16 requests merged, one refused: the halves are sent again down to the bad one, in
    about 2 log2(16) calls rather than 16."""
    model = plus1(max_batch=64, bad=5.0, delay_s=0.2)
    requests = [(body(float(i)), {}) for i in range(17)]  # the first occupies the lane
    answers = await _run(make_client, model, requests)
    assert [a.status_code for a in answers].count(400) == 1 and answers[5].status_code == 400
    assert [a.json()["result"]["y"] for i, a in enumerate(answers) if i != 5] == [
        [[i + 1.0]] for i in range(17) if i != 5
    ]
    merged = [r for r in model.rows if r > 1]  # type: ignore[attr-defined]
    assert max(model.rows) >= 8  # type: ignore[attr-defined]
    assert len(model.rows) <= 2 + 2 * 4 + 1, model.rows  # type: ignore[attr-defined]
    assert merged


async def test_a_merged_call_over_leaves_no_cycles_for_the_garbage_collector() -> None:
    """Once a merged call is over, its members, their futures and its task go by reference
    counting: left as cycles, they were most of the proxy's collections under load (~1,700
    members a second at c=32, bench/README.md)."""
    from proxy.transport.members import Member, Merged

    async def send(target, inputs, *, outputs, timeout, request_id):
        await asyncio.sleep(0.001)
        return {"y": inputs["x"] + 1}

    lane, infer = _lane(send)
    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            answers = await asyncio.gather(*(infer(float(i)) for i in range(8)))
            assert [a["y"][0, 0] for a in answers] == [i + 1.0 for i in range(8)]
        await asyncio.sleep(0.01)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, Member | Merged)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert lane.in_flight == 0
    assert not left, f"{len(left)} members and merged calls left as cycles"


@pytest.mark.parametrize("declared", [False, True])
async def test_a_declared_batch_the_server_cannot_take_costs_calls_not_answers(
    declared: bool,
) -> None:
    """A model said to batch by its variable (`<VARIABLE>_MAX_BATCH_SIZE`) whose server fails
    a call of several rows on its own account (INTERNAL: MLServer's runtime, a fixed batch
    of one): the merged call is sent again by halves down to single requests, each answered.
    A server that reported its batch size is taken at its word: the failure is everyone's."""
    rows: list[int] = []
    gate = asyncio.Event()

    async def send(target, inputs, *, outputs, timeout, request_id):
        rows.append(inputs["x"].shape[0])
        await gate.wait()
        if inputs["x"].shape[0] > 1:
            raise CallFailed(grpc.StatusCode.INTERNAL, "Got invalid dimensions for input")
        return {"y": inputs["x"] + 1}

    _, infer = _lane(send, HALVED_DECLARED if declared else HALVED)
    first = asyncio.ensure_future(infer(0.0))
    await asyncio.sleep(0.01)  # in flight, so the next ones queue and leave merged
    queued = [asyncio.ensure_future(infer(float(i))) for i in range(1, 9)]
    await asyncio.sleep(0.01)
    gate.set()
    answers = await asyncio.gather(first, *queued, return_exceptions=True)
    assert rows[:2] == [1, 8]
    if declared:
        assert [a["y"][0, 0] for a in answers] == [i + 1.0 for i in range(9)]
        assert len(rows) <= 2 + 2 * 3 + 8, rows  # by halves: 4, 4, 2, 2, 2, 2, then ones
    else:
        assert all(isinstance(a, CallFailed) for a in answers[1:])
        assert len(rows) == 2
