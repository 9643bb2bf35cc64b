"""Shadow calls (proxy/engine/shadows.py) and canaries (proxy/engine/canaries.py): how each is
read from the environment, how a shadow's answer is compared with the live one, that copies in
flight stay bounded, and which requests a canary takes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest

from bench.mesh import free_port
from proxy.engine import plan
from proxy.engine.canaries import Canary
from proxy.engine.shadows import CALLS, Shadow, Shadows, compare
from proxy.engine.step_spans import step_span
from proxy.errors import DefinitionError, StepError
from proxy.transport.calls import Call
from proxy.transport.target import Target
from tests.proxy.scripted import affine
from tests.proxy.test_pipelines import _traced, body, call, parse_model, pipeline, post

SHIPPED = Path("proxy/pipelines.yaml")
ENV = {
    "PREPROCESS_URL": "127.0.0.1:1",
    "PREDICTOR_DIGITS_LOGREG_URL": "127.0.0.1:2",
    "PREDICTOR_DIGITS_MLP_URL": "127.0.0.1:3",
    "PREDICTOR_OCR_DET_URL": "127.0.0.1:4",
    "PREDICTOR_OCR_CLS_URL": "127.0.0.1:5",
    "PREDICTOR_OCR_REC_URL": "127.0.0.1:6",
}


def test_a_shadow_is_read_beside_its_endpoint_and_never_taken_for_a_branch() -> None:
    env = {
        **ENV,
        "PREDICTOR_DIGITS_MLP_URL_SHADOW": "127.0.0.1:7/digits_mlp_v2/2",
        "PREDICTOR_DIGITS_MLP_URL_SHADOW_PERCENT": "12.5",
        "PREPROCESS_URL_SHADOW": "ipv4:127.0.0.1:8,127.0.0.1:9",
    }
    digits = plan.load(SHIPPED, env)["digits"]
    assert sorted(digits.branches(digits.pipeline.steps[1].step)) == ["logreg", "mlp"]
    mlp = digits.shadows["ensemble/mlp"]
    assert mlp.percent == 12.5
    assert mlp.target == Target(
        "PREDICTOR_DIGITS_MLP_URL_SHADOW", "127.0.0.1:7", "digits_mlp_v2", "2"
    )
    preprocess = digits.shadows["preprocess"]
    # The live step's model where the shadow names none; every call copied by default.
    assert preprocess.target.model == "digits_input" and preprocess.percent == 100
    assert preprocess.target.address == "ipv4:127.0.0.1:8,127.0.0.1:9"
    assert "ensemble/logreg" not in digits.shadows


@pytest.mark.parametrize("percent", ["0", "101", "ten", "nan", "-5"])
def test_a_shadows_percent_out_of_range_is_named_at_start(percent: str) -> None:
    env = {
        **ENV,
        "PREPROCESS_URL_SHADOW": "127.0.0.1:7",
        "PREPROCESS_URL_SHADOW_PERCENT": percent,
    }
    with pytest.raises(DefinitionError, match=r"PREPROCESS_URL_SHADOW_PERCENT=.*above 0 up to 100"):
        plan.load(SHIPPED, env)


def test_a_malformed_shadow_address_is_named_at_start() -> None:
    env = {**ENV, "PREDICTOR_DIGITS_MLP_URL_SHADOW": "nowhere"}
    with pytest.raises(DefinitionError, match="PREDICTOR_DIGITS_MLP_URL_SHADOW='nowhere'"):
        plan.load(SHIPPED, env)


def test_outputs_compare_exactly_when_whole_and_within_tolerance_when_real() -> None:
    label = np.array([3], dtype=np.int64)
    assert compare(label, label.copy()) == ("same", 0.0)
    assert compare(label, np.array([5], dtype=np.int64)) == ("differs", 2.0)
    probs = np.array([[0.1, 0.9]], dtype=np.float32)
    assert compare(probs, probs + 1e-7)[0] == "same"
    outcome, difference = compare(probs, np.array([[0.3, 0.7]], dtype=np.float32))
    assert outcome == "differs" and difference == pytest.approx(0.2)
    assert compare(probs, probs.reshape(2, 1)) == ("differs", None)
    assert compare(probs, None) == ("missing", None)
    nan = np.array([np.nan, 1.0])
    assert compare(nan, nan.copy()) == ("same", 0.0)
    assert compare(nan, np.array([0.0, 1.0])) == ("differs", float("inf"))
    inf = np.array([np.inf])
    assert compare(inf, inf.copy()) == ("same", 0.0)
    words = np.array([b"HELLO"], dtype=object)
    assert compare(words, np.array([b"HELLO"], dtype=object)) == ("same", None)
    assert compare(words, np.array([b"HELL0"], dtype=object)) == ("differs", None)


class _HeldCalls:
    """A transport whose calls wait until released: copies stay in flight meanwhile."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sent = 0

    async def call(self, call: Call, inputs, deadline: float, request_id: str):
        self.sent += 1
        await self.release.wait()
        if request_id == "fails":
            raise StepError(call.label, grpc.StatusCode.UNAVAILABLE, "the shadow failed")
        return {"label": np.array([1])}


def test_copies_beyond_the_bound_are_skipped_and_counted_never_queued() -> None:
    async def scenario() -> None:
        calls = _HeldCalls()
        shadows = Shadows(calls, max_in_flight=3, max_bytes=1 << 20)  # type: ignore[arg-type]
        target = Target("X_URL_SHADOW", "127.0.0.1:1", "m")
        live = Call("bounded", Target("X_URL", "127.0.0.1:2", "m"), (), None, 1)
        shadow = Shadow(target, 100)
        feeds = {"x": np.zeros(8, np.float32)}
        skipped = CALLS.labels("p", "bounded", "skipped")
        before = skipped._value.get()
        for i in range(5):
            shadows.copy("p", "bounded", shadow, live, feeds, {"label": np.array([1])}, 1, str(i))
        await asyncio.sleep(0)
        assert shadows.in_flight == 3 and calls.sent == 3
        assert skipped._value.get() - before == 2
        big = {"x": np.zeros(2 << 20, np.uint8)}  # more bytes than the bound holds
        shadows.copy("p", "bounded", shadow, live, big, {}, 1, "big")
        assert skipped._value.get() - before == 3
        calls.release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert shadows.in_flight == 0
        shadows.copy("p", "bounded", shadow, live, feeds, {"label": np.array([1])}, 1, "fails")
        await asyncio.sleep(0.01)
        assert CALLS.labels("p", "bounded", "failed")._value.get() == 1
        assert shadows.in_flight == 0
        # A sampled shadow copies about its share of calls.
        calls.sent = 0
        sampling = Shadows(calls, max_in_flight=4000)  # type: ignore[arg-type]
        for i in range(2000):
            sampling.copy("p", "sampled", Shadow(target, 10), live, feeds, {}, 1, str(i))
        await asyncio.sleep(0.05)  # every copy made runs and ends (the event is set)
        assert sampling.in_flight == 0
        assert 120 <= calls.sent <= 280

    asyncio.run(scenario())


def test_a_canary_needs_its_percent_and_is_covered_by_readiness_and_the_cache_key() -> None:
    env = {**ENV, "PREDICTOR_DIGITS_MLP_URL_CANARY": "127.0.0.1:7/digits_mlp_v2"}
    with pytest.raises(DefinitionError, match="PREDICTOR_DIGITS_MLP_URL_CANARY_PERCENT is not"):
        plan.load(SHIPPED, env)
    env["PREDICTOR_DIGITS_MLP_URL_CANARY_PERCENT"] = "25"
    digits = plan.load(SHIPPED, env)["digits"]
    canary = digits.canaries["ensemble/mlp"]
    assert canary.percent == 25 and canary.target.model == "digits_mlp_v2"
    assert sorted(digits.branches(digits.pipeline.steps[1].step)) == ["logreg", "mlp"]
    # What /readyz checks and the inference cache's key covers: the live models and the canary.
    assert digits.every_target["ensemble/mlp (canary)"] == canary.target
    assert canary.target in digits.sorted_targets
    assert digits.targets["ensemble/mlp"].model == "digits_mlp"


def test_a_canary_takes_its_share_by_request_id_the_same_on_every_try() -> None:
    canary = Canary(Target("X_URL_CANARY", "127.0.0.1:1", "m"), 25)
    ids = [f"request-{i}" for i in range(20_000)]
    taken = [canary.takes(i, "ensemble/mlp") for i in ids]
    assert 0.23 < sum(taken) / len(ids) < 0.27
    assert taken == [canary.takes(i, "ensemble/mlp") for i in ids]  # a retry meets the same
    # Each step chooses on its own: two canaried steps do not take the same requests.
    other = [canary.takes(i, "preprocess") for i in ids]
    both = sum(a and b for a, b in zip(taken, other, strict=True)) / len(ids)
    assert 0.04 < both < 0.085
    everything = Canary(canary.target, 100)
    assert all(everything.takes(i, "s") for i in ids[:100])


def test_a_skipped_copy_is_told_on_its_steps_span(monkeypatch) -> None:
    spans = _traced(monkeypatch)

    async def scenario() -> None:
        calls = _HeldCalls()
        shadows = Shadows(calls, max_in_flight=0, max_bytes=1 << 20)  # type: ignore[arg-type]
        target = Target("X_URL_SHADOW", "127.0.0.1:1", "m")
        live = Call("a", Target("X_URL", "127.0.0.1:2", "m"), (), None, 1)
        with step_span("a", live.target):
            feeds = {"x": np.zeros(8, np.float32)}
            shadows.copy("p", "a", Shadow(target, 100), live, feeds, {}, 1, "r")
        assert calls.sent == 0

    asyncio.run(scenario())
    [step] = spans
    assert (step.attributes or {})["mesh.shadow.outcome"] == "skipped"


async def test_a_shadows_copy_is_traced_under_its_step(servers, make_client, monkeypatch) -> None:
    """With traces on, each copy is a span under its step's (which it outlives), parent of its
    call's attempt, saying how the candidate's answer compared; one that failed says why."""
    spans = _traced(monkeypatch)
    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(affine("plus1", 1, 1)),
        "MODELS_URL_SHADOW": await servers(affine("plus1", 1, 5)),
    }
    env_gone = {**env, "MODELS_URL_SHADOW": f"127.0.0.1:{free_port()}"}
    for environ, outcome in ((env, "answered"), (env_gone, "failed")):
        spans.clear()
        pipes = {"p": pipeline([call("a", "plus1", "parse")], {"y": "a.y[0]"})}
        async with make_client(pipes, environ) as client:
            answer = await post(client, "p", body(2))
            for _ in range(200):  # the copy runs once the answer is made
                if any(s.shape.name == "shadow a" for s in spans):
                    break
                await asyncio.sleep(0.01)
        assert answer.json()["result"] == {"y": [3.0]}
        [step] = [s for s in spans if s.shape.name == "step a"]
        [copy] = [s for s in spans if s.shape.name == "shadow a"]
        assert copy.parent_id == step.span_id and copy.trace_id == step.trace_id
        attributes = copy.attributes or {}
        assert attributes["mesh.shadow.outcome"] == outcome
        if outcome == "answered":
            assert attributes["mesh.shadow.differs"] == "y differs"
            assert copy.error is None
            [attempt] = [s for s in spans if s.parent_id == copy.span_id]
            assert attempt.shape.name.startswith("inference.GRPCInferenceService/")
        else:
            gone = environ["MODELS_URL_SHADOW"]
            assert copy.error and f"endpoint {gone} unavailable" in copy.error, copy.error
