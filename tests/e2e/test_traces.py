"""Traces across every hop (issue 29): a mesh whose every process exports its spans to a real
OTLP/gRPC receiver (bench/otlp_receiver.py) answers digits; each request is one trace, the
services' spans hang under the proxy's calls, merged calls link their members, and a
client's `traceparent` is honoured on the REST door and on the gRPC door."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from bench.otlp_receiver import Received, Receiver
from compose.local import DEFAULT_FILE, LocalMesh
from compose.topology import load
from protos import messages, pb, pb_grpc
from samples.images import encode, render_digit
from tests import offsets

DIGITS_SERVICES = {"preprocess", "digits-logreg", "digits-mlp", "digits-forest"}
BODY = encode(render_digit(np.eye(8) * 16))


@dataclass
class TracedMesh:
    url: str
    grpc_address: str
    receiver: Receiver
    log: Path


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedMesh]:
    """The shipped topology, every process exporting to one receiver."""
    folder = tmp_path_factory.mktemp("traced")
    with Receiver() as receiver:
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: the test need not wait 5 s for a batch
            "PROXY_CACHE": "false",
            "PROXY_JOBS_URL": f"sqlite:///{folder}/jobs.sqlite3",
        }
        services = load(
            [DEFAULT_FILE], environ=environ, port_offset=offsets.TRACES, leave_out={"redis"}
        )
        for service in services.values():
            service.env.update(environ)
        with (folder / "mesh.log").open("w") as out:
            local = LocalMesh(services, out=out)
            try:
                local.up(timeout=180)
                env = services["proxy"].env
                yield TracedMesh(
                    f"http://127.0.0.1:{env['PROXY_PORT']}",
                    f"127.0.0.1:{env['PROXY_GRPC_PORT']}",
                    receiver,
                    folder / "mesh.log",
                )
            finally:
                local.down()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _trace(receiver: Receiver, trace_id: str, services: set[str]) -> list[Received]:
    """The trace's spans once every one of `services` and the proxy sent theirs."""

    def complete(spans: list[Received]) -> bool:
        ours = [s for s in spans if s.trace_id == trace_id]
        senders = {s.service for s in ours}
        # The proxy ends its request span last: its arrival means the proxy sent them all.
        roots = [s for s in ours if s.service == "proxy" and s.span.kind == 2]
        return services <= senders and bool(roots)

    got = receiver.wait_for(complete)
    assert got, sorted({(s.service, s.span.name, s.trace_id == trace_id) for s in receiver.spans})
    receiver.wait_for(lambda _: False, timeout_s=0.5)  # stragglers of the same batch
    return [s for s in receiver.spans if s.trace_id == trace_id]


def _check_tree(spans: list[Received], client_span: str) -> dict[str, Received]:
    """Every span's parent is in the trace, but the request's, whose parent is the client's."""
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.parent_id not in by_id]
    assert len(roots) == 1, [(s.service, s.span.name) for s in roots]
    assert roots[0].service == "proxy" and roots[0].parent_id == client_span
    return by_id


def _post_digit(traced: TracedMesh, what: str, traceparent: str) -> httpx.Response:
    """A digit to `digits`' `what` (infer, jobs) under the client's `traceparent`."""
    return httpx.post(
        f"{traced.url}/v1/pipelines/digits/{what}",
        content=BODY,
        headers={"Content-Type": "image/png", "traceparent": traceparent},
        timeout=10,
    )


def test_a_request_is_one_trace_through_every_process(traced: TracedMesh) -> None:
    header, trace_id, client_span = _traceparent()
    answer = _post_digit(traced, "infer", header)
    assert answer.status_code == 200, answer.text
    spans = _trace(traced.receiver, trace_id, DIGITS_SERVICES)
    by_id = _check_tree(spans, client_span)
    root = next(s for s in spans if s.parent_id == client_span)
    assert root.span.name == "POST /v1/pipelines/digits/infer"
    assert root.attribute("http.response.status_code") == 200
    assert root.attribute("mesh.request_id") == answer.headers["x-request-id"]
    # Steps under the request; each service's call under a step's call from the proxy.
    steps = {s.attribute("mesh.step") for s in spans if s.span.name.startswith("step ")}
    assert {"preprocess", "ensemble", "ensemble/logreg", "ensemble/mlp"} <= steps
    served = [s for s in spans if s.service in DIGITS_SERVICES and s.span.kind == 2]
    assert {s.service for s in served} == DIGITS_SERVICES
    for server in served:
        assert server.attribute("rpc.system") == "grpc"
        assert server.attribute("rpc.method") in ("ModelInfer", "ModelStreamInfer")
        caller = by_id[server.parent_id]
        assert caller.service == "proxy" and caller.span.kind == 3  # CLIENT
        assert caller.attribute("mesh.model") == server.attribute("mesh.model")
        children = {s.span.name for s in spans if s.parent_id == server.span_id}
        assert {"queue", "execute"} <= children, (server.service, children)
    execute = next(s for s in spans if s.span.name == "execute")
    assert execute.attribute("mesh.batch.requests") >= 1
    # The latency histograms name the trace behind an observation (OpenMetrics exemplars).
    exposed = httpx.get(
        f"{traced.url}/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=10
    )
    assert exposed.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = [
        line
        for line in exposed.text.splitlines()
        if line.startswith("proxy_request_duration_seconds_bucket{")
        and 'pipeline="digits"' in line
        and f'trace_id="{trace_id}"' in line
    ]
    assert exemplars, "no exemplar names the request's trace"


def test_requests_without_a_traceparent_start_traces_of_their_own(traced: TracedMesh) -> None:
    ids = set()
    for _ in range(2):
        answer = httpx.post(
            f"{traced.url}/v1/pipelines/digits/infer",
            content=BODY,
            headers={"Content-Type": "image/png"},
            timeout=10,
        )
        assert answer.status_code == 200
        request_id = answer.headers["x-request-id"]

        def found(spans: list[Received], request_id: str = request_id) -> bool:
            return any(s.attribute("mesh.request_id") == request_id for s in spans)

        assert traced.receiver.wait_for(found)
        root = next(
            s for s in traced.receiver.spans if s.attribute("mesh.request_id") == request_id
        )
        assert root.parent_id == ""
        ids.add(root.trace_id)
    assert len(ids) == 2


def test_a_jobs_run_joins_the_trace_that_submitted_it(traced: TracedMesh) -> None:
    """A job runs after its request answered 202, maybe in another process: its run is a
    CONSUMER span under the submitting request's, the steps and the services' spans under it
    (every step of a job's run was a trace of its own, found by nobody)."""
    header, trace_id, client_span = _traceparent()
    submitted = _post_digit(traced, "jobs", header)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]

    def complete(spans: list[Received]) -> bool:
        ours = [s for s in spans if s.trace_id == trace_id]
        return {s.service for s in ours} >= DIGITS_SERVICES and any(
            s.span.name == "job digits" for s in ours
        )

    assert traced.receiver.wait_for(complete), sorted(
        {(s.service, s.span.name) for s in traced.receiver.spans if s.trace_id == trace_id}
    )
    traced.receiver.wait_for(lambda _: False, timeout_s=0.5)  # stragglers of the same batch
    spans = [s for s in traced.receiver.spans if s.trace_id == trace_id]
    by_id = _check_tree(spans, client_span)
    request = next(s for s in spans if s.parent_id == client_span)
    assert request.span.name == "POST /v1/pipelines/digits/jobs"
    run = next(s for s in spans if s.span.name == "job digits")
    assert run.span.kind == 5 and run.parent_id == request.span_id  # CONSUMER
    assert run.attribute("mesh.job_id") == job_id and run.attribute("mesh.job_attempt") == 1
    steps = [s for s in spans if s.span.name.startswith("step ")]
    assert {"preprocess", "ensemble"} <= {s.attribute("mesh.step") for s in steps}
    for step in steps:  # each under the run, through its parent steps
        while step.parent_id != run.span_id:
            step = by_id[step.parent_id]
            assert step.span.name.startswith("step "), step.span.name
    with httpx.Client(base_url=traced.url, timeout=10) as client:
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"


def test_merged_calls_link_every_member(traced: TracedMesh) -> None:
    """Concurrent requests share calls (merging.py): the merged call's span is in its first
    member's trace, linked to every member's attempt, and the service's span is its child."""
    ours: set[str] = set()

    def send(header: tuple[str, str, str]) -> int:
        with httpx.Client(timeout=10) as client:
            return client.post(
                f"{traced.url}/v1/pipelines/digits/infer",
                content=BODY,
                headers={"Content-Type": "image/png", "traceparent": header[0]},
            ).status_code

    def merged(spans: list[Received]) -> list[Received]:
        return [s for s in spans if s.span.name == "merged call" and s.trace_id in ours]

    # Calls merge only when requests meet at a step: on two busy cores a burst of 48 once
    # met none (every merged call one member), so bursts are sent until two members share one.
    for _ in range(5):
        headers = [_traceparent() for _ in range(48)]
        ours |= {trace_id for _, trace_id, _ in headers}
        with ThreadPoolExecutor(16) as pool:
            assert set(pool.map(send, headers)) == {200}
        assert traced.receiver.wait_for(lambda spans: bool(merged(spans)))
        traced.receiver.wait_for(lambda _: False, timeout_s=1.0)
        if max(len(s.span.links) for s in merged(traced.receiver.spans)) >= 2:
            break
    spans = traced.receiver.spans
    by_id = {s.span_id: s for s in spans}
    call = max(merged(spans), key=lambda s: len(s.span.links))
    assert call.attribute("mesh.merged.members") == len(call.span.links) >= 2
    linked = [by_id[link.span_id.hex()] for link in call.span.links]
    assert len({s.trace_id for s in linked}) == len(linked)  # one per request
    assert all(s.span.kind == 3 and s.attribute("mesh.model") for s in linked)
    assert by_id[call.parent_id] in linked
    assert any(s.parent_id == call.span_id and s.service in DIGITS_SERVICES for s in spans)


def test_the_grpc_door_honours_a_traceparent(traced: TracedMesh) -> None:
    header, trace_id, client_span = _traceparent()
    request = messages.build_request(
        "digits", {"image": np.array([BODY], dtype=object)}, request_id="traced-grpc"
    )
    with grpc.insecure_channel(traced.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(request, timeout=10, metadata=(("traceparent", header),))
    assert isinstance(reply, pb.ModelInferResponse)
    assert "partial" in reply.parameters and not reply.parameters["partial"].bool_param
    spans = _trace(traced.receiver, trace_id, DIGITS_SERVICES)
    _check_tree(spans, client_span)
    root = next(s for s in spans if s.parent_id == client_span)
    assert root.span.name.endswith("/ModelInfer") and root.attribute("mesh.model") == "digits"


def test_log_lines_name_their_trace(traced: TracedMesh) -> None:
    """A failed step's log line carries the trace and span it was written in."""
    header, trace_id, _ = _traceparent()
    answer = httpx.post(
        f"{traced.url}/v1/pipelines/digits/infer",
        content=b"\x89PNG\r\n\x1a\n" + b"\0" * 64,  # a PNG's signature, then nothing
        headers={"Content-Type": "image/png", "traceparent": header},
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    spans = _trace(traced.receiver, trace_id, set())
    span_ids = {s.span_id for s in spans}

    def logged() -> list[dict]:
        lines = [
            json.loads(line.partition("| ")[2])
            for line in traced.log.read_text().splitlines()
            if trace_id in line
        ]
        return [entry for entry in lines if entry.get("trace_id") == trace_id]

    assert traced.receiver.wait_for(lambda _: bool(logged()), timeout_s=5), "no log line"
    assert all(entry["span_id"] in span_ids for entry in logged())
