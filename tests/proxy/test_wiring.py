"""A step swapped for a model that does not take what its pipeline sends: the service's
INVALID_ARGUMENT is the mesh's configuration error (502, naming both sides), not the client's
400; a refusal the wiring does not explain stays the client's. Real gRPC services
(tests/proxy/scripted.py) declaring their tensors in their metadata."""

from __future__ import annotations

import asyncio
import logging

import pytest
import yaml
from prometheus_client import REGISTRY

from proxy import metrics
from proxy.engine import plan
from proxy.engine.audit import Audit
from proxy.engine.wiring import fits
from tests.proxy.scripted import ScriptedModel, affine
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post
from v2server.model import TensorSpec


def _taking(spec: TensorSpec) -> ScriptedModel:
    """plus1, but declaring (and so checking, in the service) input `spec`."""
    model = affine("plus1", 1, 1)
    model.inputs = (spec,)
    return model


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            TensorSpec("x", "FP32", (-1, 3, 3)),
            "takes 'x' FP32 [-1, 3, 3]; the pipeline sends parse.x as FP32 [-1, -1]",
        ),
        (
            TensorSpec("x", "INT64", (-1, -1)),
            "takes 'x' INT64 [-1, -1]; the pipeline sends parse.x as FP32 [-1, -1]",
        ),
        (
            TensorSpec("pixels", "FP32", (-1, -1)),
            "has no input 'x' (it takes 'pixels' FP32 [-1, -1]); the pipeline sends parse.x",
        ),
    ],
    ids=["shape", "datatype", "name"],
)
async def test_a_model_that_does_not_take_what_the_pipeline_sends_is_a_502(
    servers, make_client, spec: TensorSpec, says: str
) -> None:
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(_taking(spec))}
    pipes = {"p": pipeline([call("s", "plus1", "parse")], {"y": "s.y[0]"})}
    async with make_client(pipes, env) as client:
        r = await post(client, "p", body(1, 2))
    assert r.status_code == 502, r.text
    assert r.json()["step"] == "s" and r.json()["code"] == "INTERNAL"
    assert f"pipeline misconfigured: model 'plus1' at {env['MODELS_URL']} {says}" in r.text


async def test_a_refusal_the_wiring_does_not_explain_stays_the_clients(
    servers, make_client
) -> None:
    """The model takes what the pipeline sends as declared; it refuses these values."""
    model = _taking(TensorSpec("x", "FP32", (-1, 2)))  # the pipeline declares [-1, -1]
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    pipes = {"p": pipeline([call("s", "plus1", "parse")], {"y": "s.y[0]"})}
    async with make_client(pipes, env) as client:
        fitting = await post(client, "p", body(1, 2))
        three = await post(client, "p", body(1, 2, 3))
    assert fitting.status_code == 200, fitting.text
    assert three.status_code == 400 and three.json()["step"] == "s", three.text
    assert "misconfigured" not in three.text


@pytest.mark.parametrize(
    ("sent", "taken", "expected"),
    [
        (("FP32", (-1, 64)), ("FP32", (-1, 64)), True),
        (("FP32", (1, 64)), ("FP32", (-1, -1)), True),
        (("FP32", (-1, -1)), ("FP32", (-1, 64)), True),  # may fit: the service judges
        (("FP32", (-1, 64)), ("FP32", (-1, 784)), False),
        (("FP32", (-1, 64)), ("FP32", (-1, 8, 8)), False),
        (("FP32", (-1, 64)), ("FP64", (-1, 64)), False),
        (("BYTES", (-1,)), ("BYTES", (1,)), True),
    ],
)
def test_what_fits(sent, taken, expected: bool) -> None:
    assert fits(sent, taken) is expected


async def test_a_model_its_endpoint_does_not_serve_is_a_503_not_a_404(servers, make_client) -> None:
    """The pipeline exists; its model is not served where the variable points (unloaded,
    not loaded yet, re-pointed): a 503 naming the model and the endpoint, as Triton answers
    an ensemble whose composing model is not ready. A 404 told the client the pipeline was
    missing, and the step metric did not count it as the step failing."""
    elsewhere = await servers(affine("x", 1, 0))
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": elsewhere}
    env["BRANCH_ONE_URL"] = elsewhere  # serves `x`, not `one`
    env["BRANCH_TWO_URL"] = await servers(affine("two", 1, 3))
    ensemble = {
        "name": "ens",
        "branches_from": {"prefix": "BRANCH_"},
        "inputs": {"x": "parse.x"},
        "aggregation": "partial",
        "combine": {"op": "mean", "tensor": "y"},
    }
    pipes = {
        "p": pipeline([call("s", "plus1", "parse")], {"y": "s.y[0]"}),
        "ens": pipeline([{"parallel": ensemble}], {"mean": "ens.y[0]"}),
    }
    async with make_client(pipes, env) as client:
        r = await post(client, "p", body(1, 2))
        partial = await post(client, "ens", body(1, 2))
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "UNAVAILABLE" and r.json()["step"] == "s"
    assert f"model 'plus1' is not served at {elsewhere}" in r.text
    assert "unknown model 'plus1'" in r.text  # what the service said, kept
    assert partial.status_code == 200 and partial.json()["partial"] is True, partial.text
    failed = next(s for s in partial.json()["steps"] if s["name"] == "ens/one")
    assert failed["status"] == "unavailable" and "is not served" in failed["error"]


def _optional_z() -> ScriptedModel:
    """plus1, declaring an output `z` it does not always send (as the OCR recipes' optional
    outputs)."""
    model = affine("plus1", 1, 1)
    model.outputs = (*model.outputs, TensorSpec("z", "FP32", (-1, -1)))
    return model


@pytest.mark.parametrize("where", ["result", "input", "per_branch", "outputs"])
async def test_a_tensor_the_model_does_not_have_is_a_502_not_a_null(
    servers, make_client, where: str
) -> None:
    """A typo in the definition (`s.yy`), or a model swapped for one with other outputs: the
    step ran, and its model declares no such output. Read by the result it answered null
    with 200 on every request; read by a later step, the client's 400."""
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(_optional_z())}
    reader = {"call": {"name": "t", "endpoint": "MODELS_URL", "model": "plus1"}}
    reader["call"]["inputs"] = {"x": "s.yy"}
    fan = {
        "name": "ens",
        "branches": [{"name": "one", "endpoint": "MODELS_URL", "model": "plus1"}],
        "inputs": {"x": "parse.x"},
    }
    steps = [call("s", "plus1", "parse")]
    result = {
        "result": {"y": "s.yy[0]"},
        "input": {"y": "t.y[0]"},
        "per_branch": {"each": {"per_branch": "ens", "fields": {"y": "yy[0]"}}},
        "outputs": {"y": "s.y[0]"},
    }[where]
    # The v2 doors' output: a variable shape found nothing answered an empty tensor.
    typed = {"y": {"tensor": "s.yy", "datatype": "FP32", "shape": [-1, -1]}}
    extra = {"outputs": typed} if where == "outputs" else {}
    steps += {"input": [reader], "per_branch": [{"parallel": fan}]}.get(where, [])
    optional = {"y": "s.y[0]", "z": "s.z"}  # declared, not sent: null, as before
    pipes = {"p": pipeline(steps, result, **extra), "optional": pipeline(steps[:1], optional)}
    async with make_client(pipes, env) as client:
        r = await post(client, "p", body(1, 2))
        fine = await post(client, "optional", body(1, 2))
    assert r.status_code == 502, r.text
    assert r.json()["code"] == "INTERNAL", r.text
    step = {"input": "t", "per_branch": "ens/one"}.get(where, "s")  # whose definition
    assert r.json()["step"] == step, r.text
    read = "'yy' of ens/one" if where == "per_branch" else "'s.yy'"
    assert (
        f"pipeline misconfigured: the pipeline reads {read}, but model 'plus1' at "
        f"{env['MODELS_URL']} has no output 'yy' (it has y, z)"
    ) in r.text
    assert fine.status_code == 200 and fine.json()["result"] == {"y": [2.0, 3.0], "z": None}


async def test_the_background_audit_names_what_does_not_fit_before_a_request_meets_it(
    servers, make_client, caplog: pytest.LogCaptureFixture
) -> None:
    """No request is sent: the audit reads the models' metadata (the proxy's catalog) and
    says which pipeline does not fit, and why, in its log line and its gauge (the
    MeshPipelineMisconfigured alert); a pipeline that fits reads 0."""
    cubes = affine("cubes", 1, 1)
    cubes.inputs = (TensorSpec("x", "FP32", (-1, 3, 3)),)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(cubes)}
    env["PLUS_URL"] = await servers(affine("plus1", 1, 1))
    fan = {
        "name": "ens",
        "branches": [{"name": "one", "endpoint": "PLUS_URL", "model": "plus1"}],
        "inputs": {"x": "parse.x"},
        "combine": {"op": "mean", "tensor": "probs"},  # plus1 answers `y`
    }
    pipes = {
        "audit-fits": pipeline([call("s", "plus1", "parse", endpoint="PLUS_URL")], {"y": "s.y"}),
        "audit-inputs": pipeline([call("s", "cubes", "parse")], {"y": "s.y"}),
        "audit-outputs": pipeline(
            [call("s", "plus1", "parse", endpoint="PLUS_URL")], {"y": "s.yy[0]"}
        ),
        "audit-combine": pipeline([{"parallel": fan}], {"p": "ens.probs"}),
    }

    def gauge(name: str) -> float | None:
        return REGISTRY.get_sample_value("proxy_pipeline_misconfigured", {"pipeline": name})

    caplog.set_level(logging.ERROR, logger="proxy.audit")
    async with make_client(pipes, env, wiring_check_s=0.2, cache_check_ms=100):
        deadline = asyncio.get_running_loop().time() + 15
        while {gauge("audit-inputs"), gauge("audit-outputs"), gauge("audit-combine")} != {1}:
            assert asyncio.get_running_loop().time() < deadline, caplog.text
            await asyncio.sleep(0.1)
        assert gauge("audit-fits") == 0
    said = [r.getMessage() for r in caplog.records]
    assert (
        f"pipeline misconfigured: step 's': model 'cubes' at {env['MODELS_URL']} takes 'x' "
        "FP32 [-1, 3, 3]; the pipeline sends parse.x as FP32 [-1, -1]"
    ) in said, said
    assert (
        f"pipeline misconfigured: step 's': the pipeline reads 's.yy', but model 'plus1' at "
        f"{env['PLUS_URL']} has no output 'yy' (it has y)"
    ) in said, said
    assert (
        f"pipeline misconfigured: step 'ens/one': the pipeline reads 'probs' of ens/one, but "
        f"model 'plus1' at {env['PLUS_URL']} has no output 'probs' (it has y)"
    ) in said, said
    assert len(said) == 3, "each said once, not each period"


class _CannotSay:
    """Wiring whose models' metadata cannot be read now (their services down)."""

    async def metadata(self, target: object) -> None:
        return None

    async def why_not(self, *args: object) -> None:
        return None


async def test_a_model_that_cannot_say_keeps_the_audits_last_verdict(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """A service down is neither "fits again" (the gauge cleared, the alert resolved) nor,
    once back, a problem logged a second time."""
    path = tmp_path / "p.yaml"
    pipes = {"audit-down": pipeline([call("s", "plus1", "parse")], {"y": "s.y"})}
    path.write_text(yaml.safe_dump({"pipelines": pipes}))
    plans = plan.load(path, {"PARSE_URL": "127.0.0.1:1", "MODELS_URL": "127.0.0.1:2"})
    audit = Audit(plans, _CannotSay(), every_s=0)  # type: ignore[arg-type]
    audit.start()
    known = ["step 's': model 'plus1' at 127.0.0.1:2 takes 'x' FP32 [-1, 3, 3]; ..."]
    audit.problems["audit-down"] = known
    metrics.PIPELINE_MISCONFIGURED.labels("audit-down").set(1)
    caplog.set_level(logging.INFO, logger="proxy.audit")
    await audit.check_all()
    assert audit.problems["audit-down"] == known
    sample = {"pipeline": "audit-down"}
    assert REGISTRY.get_sample_value("proxy_pipeline_misconfigured", sample) == 1
    assert caplog.records == []
    await audit.stop()
