"""Pipelines as v2 models: what the proxy's gRPC door (the shared v2 server core) and its
/v2 REST routes serve. Input: the image, BYTES [1]; outputs: as the definition declares
(`outputs`), or one BYTES `result` holding the /v1 result as JSON. A pipeline that declares
outputs gives `result` too when it is asked for by name (not in its metadata, so a client
asking for every output gets the declared ones).

Every answer's parameters say what /v1's answer says beside its result: `partial` (bool) and
`steps` (JSON text: each step's name, status, latency and error, as /v1's `steps`), so that a
partial answer over gRPC names the branch that failed; `cache` when the pipeline has one."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson

from protos.codec import datatype_of, dtype_of
from protos.errors import InvalidInput, MeshError
from protos.logs import REQUEST_ID, new_id
from proxy.engine.plan import Plan
from proxy.engine.run import Run
from proxy.engine.runner import Engine
from proxy.errors import Problem, StepError, grpc_code
from v2server.model import Outputs, Scheduling, TensorSpec
from v2server.statistics import ModelStatistics
from v2server.validation import shape_matches

RESULT = "result"
"""The one output of a pipeline whose definition declares none."""


def counted(statistics: ModelStatistics, cache: str | None, elapsed_ns: int) -> None:
    """A pipeline's answered request in Triton's counters, whichever door it came by (the
    request's success or failure is its door's to count): one execution of one row, no
    queue, the whole run its compute time, which perf_analyzer reads (it finds the model's
    version by the queue count that grew during its window) to split the request's time.
    An answer from the cache is a cache hit instead of an execution, as in Triton."""
    statistics.queue.add(0)
    if cache == "hit":
        statistics.cache_hit.add(elapsed_ns)
    else:
        if cache == "miss":
            statistics.cache_miss.add(0)
        statistics.execution(1, 1, 0, elapsed_ns, 0)


class PipelineFailed(MeshError):
    """A pipeline request failed as the REST door answers `problem`; on gRPC its status is
    the one the table gives for that HTTP status."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.code = grpc_code(problem.status)
        self.problem = problem
        self.http_status = problem.status
        """Told to gRPC callers beside the code (protos.channels.HTTP_STATUS_PARAMETER)."""
        self.retry_after = problem.retry_after
        """REST's `Retry-After`, told to gRPC callers as their retries' pushback."""


class PipelineModel:
    """One pipeline, `Served` (v2server/model.py) so the server core can host it."""

    version = "1"
    platform = "pipeline"
    labels: dict[str, list[str]] = {}
    """A pipeline's outputs have no class names."""
    scheduling = Scheduling(max_batch_size=0)
    """Inputs are full shapes: one image a request (the proxy merges calls downstream)."""

    def __init__(
        self, plan: Plan, engine: Engine, max_timeout_ms: float, statistics: ModelStatistics
    ) -> None:
        """`statistics`: the pipeline's, which /v1 counts too (ProxyState.statistics)."""
        self.plan = plan
        self.engine = engine
        self.max_timeout_s = max_timeout_ms / 1000
        self.name = plan.name
        self.input = plan.pipeline.input
        taken = plan.pipeline.inputs
        self.inputs = (
            tuple(TensorSpec(n, i.datatype, tuple(i.shape)) for n, i in taken.items())
            if taken is not None
            else (TensorSpec(self.input, "BYTES", (1,)),)
        )
        declared = plan.pipeline.outputs
        self.outputs = (
            tuple(TensorSpec(n, o.datatype, tuple(o.shape)) for n, o in declared.items())
            if declared
            else (TensorSpec(RESULT, "BYTES", (1,)),)
        )
        self.on_request = frozenset({RESULT}) if declared else frozenset()
        self.statistics = statistics

    @property
    def ready(self) -> bool:
        """Loaded; whether the services answer is /readyz's question (as a Triton ensemble
        stays ready while a model it calls is down)."""
        return True

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def infer(
        self, inputs: dict[str, np.ndarray], deadline: float | None
    ) -> dict[str, np.ndarray]:
        """Run the pipeline on the image (or its declared `inputs`); `deadline` (loop time)
        is the caller's, or None: the pipeline's own budget. Either is capped by
        PROXY_MAX_TIMEOUT_MS."""
        tensors = self.plan.pipeline.inputs is not None
        body = b"" if tensors else inputs[self.input].reshape(-1)[0]
        if not isinstance(body, bytes):
            raise InvalidInput(f"pipeline '{self.name}': input '{self.input}' must hold bytes")
        now = asyncio.get_running_loop().time()
        cap = now + self.max_timeout_s
        if deadline is None:
            deadline = now + self.plan.pipeline.timeout_ms / 1000
        deadline = min(deadline, cap)
        request_id = REQUEST_ID.get() or new_id()
        started = time.perf_counter_ns()
        try:
            async with self.engine.ticket(self.plan, deadline) as ticket:
                if tensors:
                    run = await ticket.run_tensors(inputs, request_id)
                else:
                    ticket.ledger.hold(len(body))
                    run = await ticket.run(body, request_id)
                outputs = self.tensors(run)
            counted(self.statistics, run.cache, time.perf_counter_ns() - started)
            about: dict[str, str | int | bool] = {
                "partial": run.partial,
                "steps": orjson.dumps([s.__dict__ for s in run.steps]).decode(),
            }
            if run.cache is not None:
                about["cache"] = run.cache
            if not self.on_request:
                return Outputs(outputs, about)
            return Outputs(outputs, about, {RESULT: lambda: self._result(run)})
        except StepError as exc:
            raise PipelineFailed(exc.problem(self.name)) from None
        except Problem as exc:
            raise PipelineFailed(exc) from None

    def _result(self, run: Run) -> np.ndarray:
        """/v1's result as JSON, BYTES [1]; a cache hit's as rendered once and kept, as /v1
        answers it (Engine.result_to_serialise)."""
        result = self.engine.result_to_serialise(run)
        answer = orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        return np.array([answer], dtype=object)

    def tensors(self, run: Run) -> dict[str, np.ndarray]:
        declared = self.plan.pipeline.outputs
        if not declared:
            return {RESULT: self._result(run)}
        out = {}
        for spec in self.outputs:
            value = run.tensors.get(declared[spec.name].tensor)
            out[spec.name] = self._checked(spec, value)
        return out

    def _checked(self, spec: TensorSpec, value: np.ndarray | None) -> np.ndarray:
        if value is None:  # a step a switch skipped: nothing found is an empty answer
            if -1 not in spec.shape:
                raise self._broken(f"output '{spec.name}' was not produced")
            shape = tuple(0 if d == -1 else d for d in spec.shape)
            return np.empty(shape, dtype=dtype_of(spec.datatype, spec.name))
        got = datatype_of(value)
        if got != spec.datatype or not shape_matches(spec.shape, value.shape):
            raise self._broken(
                f"output '{spec.name}' came as {got} {list(value.shape)}, declared "
                f"{spec.datatype} {list(spec.shape)}"
            )
        return value

    def _broken(self, what: str) -> PipelineFailed:
        return PipelineFailed(
            Problem(502, f"pipeline '{self.name}': {what} (check its `outputs` definition)")
        )
