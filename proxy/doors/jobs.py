"""The /v1 jobs door: a pipeline request that answers later (proxy/jobs/).

The body is read and checked as /infer checks it (format, declared tensors, size), so a job
that cannot run is refused now, not failed later; then it is stored and 202 answers at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np
from fastapi import Request, Response

from protos import tracing
from proxy.doors import job_schemas, schemas
from proxy.doors.pipeline_bodies import budget_s, read_tensors
from proxy.doors.responses import json_response
from proxy.doors.route import Route
from proxy.doors.uploads import read_image
from proxy.engine.accepted import check_format, check_tensors
from proxy.engine.cache.entries import Stored, pack
from proxy.engine.cache.keys import digest_of
from proxy.engine.plan import Plan
from proxy.errors import Problem
from proxy.jobs.model import (
    STATUSES,
    IdempotencyConflict,
    InputKind,
    Job,
    QueueError,
    QueueFull,
    Submission,
    iso,
)
from proxy.jobs.service import Jobs
from proxy.state import ProxyState

T = TypeVar("T")

MAX_KEY = 255
"""Longest Idempotency-Key accepted."""
MAX_PAGE = 1000


async def enqueue(
    jobs: Jobs,
    pipeline: str,
    kind: InputKind,
    payload: bytes,
    budget_s: float,
    callback: str | None = None,
    key: str | None = None,
) -> tuple[Job, bool]:
    """A checked request stored as a job; the queue's refusals as the doors answer them."""
    # Off the loop for a big upload (an OCR page's job), as the caches' keys are.
    digest = (await digest_of([f"{pipeline}\0{kind}\0".encode(), payload], len(payload))).hex()
    attempts = jobs.config.attempts
    submission = Submission(
        pipeline, kind, payload, attempts, budget_s * 1000, callback, key, digest,
        tracing.traceparent(),
    )  # fmt: skip
    try:
        return await jobs.submit(submission)
    except QueueFull as exc:
        raise Problem(429, f"the jobs' queue is full ({exc.args[0]}): come back later") from None
    except IdempotencyConflict as exc:
        raise Problem(
            422,
            f"Idempotency-Key {key!r} already names job {exc.args[0]}, of another pipeline or body",
        ) from None
    except QueueError as exc:
        raise Problem(503, str(exc)) from None


def job_options(request: Request, jobs: Jobs) -> tuple[str | None, str | None]:
    """A job's callback URL (`?callback=`, allowed hosts only) and Idempotency-Key, checked:
    400 naming what is wrong."""
    # Parsing a query string (~5% of an enqueue) only when there is one.
    callback = request.query_params.get("callback") if request.scope["query_string"] else None
    if callback is not None:
        callback = jobs.callback(callback)
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= MAX_KEY:
        raise Problem(400, f"Idempotency-Key must be 1 to {MAX_KEY} characters")
    return callback, key


def later_options(request: Request, state: ProxyState, plan: Plan) -> tuple[str | None, str | None]:
    """/infer's job options: its later part's (a sync-async pipeline); a callback asked of a
    pipeline that answers only now is a 400, not a callback that never comes."""
    if plan.pipeline.later is not None:
        return job_options(request, state.jobs)
    # Most /infer calls carry no query string: parsing one (~2 us) is then skipped.
    if request.scope["query_string"] and "callback" in request.query_params:
        raise Problem(
            400,
            f"pipeline '{plan.name}' answers now: a callback is for a job "
            f"(POST /v1/pipelines/{plan.name}/jobs) or a sync-async pipeline's later part",
        )
    return None, None


async def later(
    state: ProxyState,
    plan: Plan,
    kind: InputKind,
    payload: bytes | dict[str, np.ndarray],
    options: tuple[str | None, str | None] = (None, None),
) -> dict[str, Any]:
    """A sync-async pipeline's job: its `later` pipeline on the same input, with the
    request's callback and Idempotency-Key (`options`: a retried /infer names the same job).
    What the answer says of it: the job, or why there is none (the fast answer stands
    either way)."""
    name = plan.pipeline.later
    assert name is not None
    other = state.engine.plan(name)
    budget = min(other.pipeline.timeout_ms, state.settings.max_timeout_ms) / 1000
    data = payload if isinstance(payload, bytes) else pack(Stored(payload))
    try:
        job, _ = await enqueue(state.jobs, name, kind, data, budget, *options)
    except Problem as exc:
        return {"pipeline": name, "error": {"status": exc.status, "error": exc.message}}
    return {"pipeline": name, "job": job.id, "location": f"/v1/jobs/{job.id}"}


class JobEndpoints:
    def __init__(self, state: ProxyState, jobs: Jobs) -> None:
        self.state = state
        self.jobs = jobs

    async def submit(self, request: Request, name: str) -> Response:
        """POST /v1/pipelines/{name}/jobs: the same bodies as /infer; 202 with the job."""
        state, jobs = self.state, self.jobs
        plan = state.engine.plan(name)
        kind: InputKind
        budget = budget_s(request, plan.pipeline.timeout_ms, state.settings.max_timeout_ms)
        callback, key = job_options(request, jobs)
        # The upload gets the request's budget, as /infer's does.
        deadline = asyncio.get_running_loop().time() + budget
        with state.engine.admission.ledger() as ledger:
            state.engine.admission.check_room()
            if plan.pipeline.inputs is None:
                payload = await read_image(request, state.uploads, deadline, ledger)
                check_format(payload, plan)
                kind = "image"
            else:
                inputs = await read_tensors(request, plan, state.uploads, deadline, ledger)
                check_tensors(plan, inputs)
                payload, kind = pack(Stored(inputs)), "tensors"
        job, new = await enqueue(jobs, name, kind, payload, budget, callback, key)
        headers = {"Location": f"/v1/jobs/{job.id}"}
        if not new:
            headers["Idempotent-Replayed"] = "true"
        body = {"id": job.id, "status": job.status, "pipeline": job.pipeline}
        return json_response({**body, "created": iso(job.created)}, 202, headers)

    async def get(self, job_id: str) -> Response:
        """GET /v1/jobs/{id}."""
        return json_response((await self._known(job_id)).public())

    async def cancel(self, job_id: str) -> Response:
        """DELETE /v1/jobs/{id}: cancelled if not final yet (its calls with it)."""
        job, ended = await self._stored(self.jobs.cancel(job_id))
        if job is None:
            raise self._unknown(job_id)
        if not ended:
            raise Problem(409, f"job {job_id} has already ended: {job.status}")
        return json_response(job.public())

    async def list(self, request: Request) -> Response:
        """GET /v1/jobs?pipeline=&status=&limit=&cursor=: newest first."""
        query = request.query_params
        status = query.get("status")
        if status is not None and status not in STATUSES:
            raise Problem(400, f"status must be one of {', '.join(STATUSES)}, not {status!r}")
        raw = query.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
            raise Problem(400, f"limit must be a whole number from 1 to {MAX_PAGE}, not {raw!r}")
        cursor = query.get("cursor")
        try:
            page = await self._stored(
                self.jobs.page(query.get("pipeline"), status, int(raw), cursor)
            )
        except ValueError:
            raise Problem(400, f"cursor {cursor!r} is not one this list gave") from None
        return json_response({"jobs": [j.public() for j in page.jobs], "next": page.next})

    async def _known(self, job_id: str) -> Job:
        job = await self._stored(self.jobs.get(job_id))
        if job is None:
            raise self._unknown(job_id)
        return job

    def _unknown(self, job_id: str) -> Problem:
        keep_h = self.jobs.config.keep_s / 3600
        return Problem(404, f"no job {job_id!r} (ended jobs are kept {keep_h:g} h)")

    @staticmethod
    async def _stored(pending: Awaitable[T]) -> T:
        try:
            return await pending
        except QueueError as exc:
            raise Problem(503, str(exc)) from None


def _parameters(whose: str) -> list[dict[str, Any]]:
    """The job options' OpenAPI parameters; `whose`: the job they are of."""
    return [
        {
            "name": "callback",
            "in": "query",
            "required": False,
            "description": f"URL {whose} is POSTed to once ended (allowed hosts only)",
            "schema": {"type": "string"},
        },
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": f"the same key and body give the same job ({whose})",
            "schema": {"type": "string", "maxLength": MAX_KEY},
        },
    ]


LATER_PARAMETERS = _parameters("a sync-async pipeline's later part")


def routes(endpoints: JobEndpoints) -> list[Route]:
    """The jobs' routes, in the proxy's table (routes.py)."""
    image_body = {k: v for k, v in schemas.IMAGE_BODY.items() if k != "parameters"}
    return [
        Route(
            "POST",
            "/v1/pipelines/{name}/jobs",
            endpoints.submit,
            {
                "tags": ["jobs"],
                "summary": "Run a request later: 202 with the job (the same bodies as /infer)",
                "status_code": 202,
                "response_model": job_schemas.JobAccepted,
                "responses": schemas.errors(400, 401, 404, 408, 413, 415, 422, 429, 503),
                "openapi_extra": {
                    **image_body,
                    "parameters": _parameters("the job"),
                },
            },
        ),
        Route(
            "GET",
            "/v1/jobs",
            endpoints.list,
            {
                "tags": ["jobs"],
                "summary": "Jobs, newest first, by pipeline and status, a page at a time",
                "response_model": job_schemas.JobList,
                "responses": schemas.errors(400, 401, 503),
            },
        ),
        Route(
            "GET",
            "/v1/jobs/{job_id}",
            endpoints.get,
            {
                "tags": ["jobs"],
                "summary": "A job: its state, and its result or error once it ended",
                "response_model": job_schemas.JobView,
                "responses": schemas.errors(401, 404, 503),
            },
        ),
        Route(
            "DELETE",
            "/v1/jobs/{job_id}",
            endpoints.cancel,
            {
                "tags": ["jobs"],
                "summary": "Cancel a job not ended yet (a running one's calls too)",
                "response_model": job_schemas.JobView,
                "responses": schemas.errors(401, 404, 409, 503),
            },
        ),
    ]
