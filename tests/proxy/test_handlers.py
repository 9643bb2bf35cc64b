"""The handlers as plain objects over a ProxyState: no app, no router, no middleware."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml
from starlette.requests import Request

from proxy.doors import v2plane
from proxy.doors.health import HealthEndpoints
from proxy.doors.rest import PipelineEndpoints, budget_s
from proxy.doors.v2rest import V2Endpoints
from proxy.errors import Problem
from proxy.settings import ProxySettings
from proxy.state import ProxyState
from tests.leaks import Uploads, collector_off
from tests.proxy.test_pipelines import call, pipeline


def state_for(tmp_path: Path, env: dict[str, str], **settings) -> ProxyState:
    path = tmp_path / "pipelines.yaml"
    pipes = {"p": pipeline([call("a", "plus1", "parse")], {"y": "a.y[0]"})}
    path.write_text(yaml.safe_dump({"pipelines": pipes}))
    return ProxyState.build(ProxySettings(pipelines=path, **settings), env)


def request_with(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, 2.0), ("500", 0.5), ("60000", 3.0)],  # the pipeline's default, asked, capped
)
def test_budget_is_the_header_or_the_pipeline_default_capped(header, expected) -> None:
    request = request_with({} if header is None else {"X-Request-Timeout-Ms": header})
    assert budget_s(request, 2000, 3000) == expected


async def test_readiness_names_each_endpoint_and_why_it_is_not_ready(tmp_path: Path) -> None:
    # Nothing listens on these ports: each pair is reported not ready, with the reason.
    env = {"PARSE_URL": "127.0.0.1:9", "MODELS_URL": "127.0.0.1:9"}
    state = state_for(tmp_path, env, ready_timeout_ms=300)
    try:
        report = await HealthEndpoints(state).readiness()
        answer = await HealthEndpoints(state).ready()
    finally:
        await state.channels.close()
    jobs = report.pop("PROXY_JOBS_URL/jobs")
    assert set(report) == {"PARSE_URL/parse", "MODELS_URL/plus1"}
    assert all(not item["ready"] and item["error"] for item in report.values())
    assert jobs["ready"] and jobs["address"].startswith("sqlite:///")  # the queue's store
    assert answer.status_code == 503 and orjson.loads(answer.body)["ready"] is False


async def test_pipeline_list_and_unknown_names(tmp_path: Path) -> None:
    env = {"PARSE_URL": "127.0.0.1:9", "MODELS_URL": "127.0.0.1:10"}
    state = state_for(tmp_path, env)
    listing = orjson.loads((await PipelineEndpoints(state).list_pipelines()).body)
    assert listing["p"]["targets"]["a"] == {
        "endpoint": "MODELS_URL",
        "address": "127.0.0.1:10",
        "model": "plus1",
        "version": "",
    }
    with pytest.raises(Problem) as unknown_pipeline:
        await PipelineEndpoints(state).infer(request_with({}), "nope")
    with pytest.raises(Problem) as unknown_model:
        await V2Endpoints(state, v2plane.build(state)).metadata("nope")
    assert unknown_pipeline.value.status == 404 and "known: p" in unknown_pipeline.value.message
    assert unknown_model.value.status == 404
    assert "served: p, parse, plus1" in unknown_model.value.message
    await state.channels.close()


def test_a_refused_v2_request_leaves_no_cycle_that_holds_its_upload() -> None:
    # The door raised the Problem a PipelineFailed carries while handling it: the Problem's
    # context became the PipelineFailed, which holds the Problem, a cycle only a full
    # collection frees. Refused OCR photos on v2 REST kept ~170 MiB so.
    from protos.errors import MeshError
    from proxy.doors.pipeline_models import PipelineFailed
    from proxy.doors.v2rest import problem

    uploads = Uploads()

    def refused() -> None:
        _upload = uploads.new()
        raise PipelineFailed(Problem(503, "pipeline 'ocr' at capacity"))

    def door() -> None:
        try:
            refused()
        except MeshError as exc:
            raise problem(exc) from None

    with collector_off():
        with pytest.raises(Problem, match="at capacity") as raised:
            door()
        assert raised.value.status == 503
        del raised
        assert uploads.alive() == 0  # gone with the error, no collection needed


def test_a_refusals_own_wait_reaches_the_client_on_both_rest_doors() -> None:
    # A refusal for the work ahead says when that work would fit (engine/admission.py);
    # other 503s and 429s come back after RETRY_AFTER's second; other statuses never.
    from proxy.doors.pipeline_models import PipelineFailed
    from proxy.doors.responses import problem_response
    from proxy.doors.v2rest import problem

    shed = Problem(
        503, "pipeline 'ocr' would not answer within the request's budget", retry_after="7"
    )
    for door in (shed, problem(PipelineFailed(shed))):  # /v1, and v2 REST's copy of it
        assert problem_response(door, "r1").headers["Retry-After"] == "7"
    assert problem_response(Problem(503, "proxy at capacity"), "r2").headers["Retry-After"] == "1"
    assert problem_response(Problem(429, "queue full"), "r3").headers["Retry-After"] == "1"
    assert "Retry-After" not in problem_response(Problem(400, "bad image"), "r4").headers
