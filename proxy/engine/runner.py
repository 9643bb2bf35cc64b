"""The engine's one way in, whichever door a request came by (REST /v1, v2 REST, v2 gRPC):
the pipeline looked up, admission decided (room for the body before it is read, the
pipeline's own limits once its image is known), the run, and the request's metrics.

A door opens a `Ticket` before it reads the body (so a full proxy refuses before a byte is
taken), reads the body onto the ticket's ledger, and runs it:

    async with engine.ticket(plan, deadline) as ticket:
        body = await read(..., ticket.ledger)
        run = await ticket.run(body, request_id)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from protos import media
from protos.codec import content_bytes
from protos.logs import REQUEST_ID
from proxy.engine.accepted import check_format, check_tensors
from proxy.engine.admission import Admission
from proxy.engine.cache.answers import Answers
from proxy.engine.cache.caches import Caches
from proxy.engine.cache.keys import pipeline_key, pipeline_key_now
from proxy.engine.canaries import by_choice
from proxy.engine.executor import Executor
from proxy.engine.ledger import Ledger
from proxy.engine.pixels import counted
from proxy.engine.plan import Plan
from proxy.engine.predictions import PredictionLog
from proxy.engine.recent import Recent
from proxy.engine.recorded import Outcome, recorded
from proxy.engine.run import Ended, Run, StepStatus, ms
from proxy.errors import Problem
from proxy.transport.catalog import Catalog


class Engine:
    """The pipelines of this process and what runs them."""

    def __init__(
        self,
        plans: dict[str, Plan],
        executor: Executor,
        admission: Admission,
        caches: Caches | None = None,
        recent: Recent | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self.plans = plans
        self.executor = executor
        self.admission = admission
        self.caches = caches
        """The inference and data caches (None: none at all)."""
        self.recent = recent
        """The console's record of the last requests (None: the console is off)."""
        self.catalog = catalog
        """The models' configurations: how many pixels a model decodes of an upload."""
        self.predictions: PredictionLog | None = None
        """The prediction log (PROXY_PREDICTION_LOG; None: off)."""

    async def close(self) -> None:
        """What the engine runs in the background: shadows' copies cancelled, the prediction
        log's records written, the caches' connections closed."""
        await self.executor.shadows.close()
        if self.predictions is not None:
            await self.predictions.close()
        if self.caches is not None:
            await self.caches.close()

    def plan(self, name: str) -> Plan:
        plan = self.plans.get(name)
        if plan is None:
            known = ", ".join(sorted(self.plans))
            raise Problem(404, f"unknown pipeline '{name}' (known: {known})")
        return plan

    def models(self) -> dict[str, str]:
        """Model name -> address of the first endpoint any pipeline uses for it."""
        hosts: dict[str, str] = {}
        for plan in self.plans.values():
            for target in plan.targets.values():
                hosts.setdefault(target.model, target.address)
        return hosts

    def result(self, run: Run) -> object:
        """The pipeline's answer as its `result` template shapes it (rendered once a run)."""
        rendered = run.rendered
        if rendered is None:
            rendered = run.rendered = self.executor.result(run)
        return rendered

    def result_to_serialise(self, run: Run) -> object:
        """The result for a door that answers with orjson: a cache hit's as JSON rendered
        once and kept (Caches.rendered), any other's rendered now."""
        key, caches = run.key, self.caches
        if key is None or caches is None:
            return self.result(run)
        found = caches.rendered.get_now(key)
        if found is None:
            found = orjson.dumps(self.result(run), option=orjson.OPT_SERIALIZE_NUMPY)
            caches.rendered.put_now(key, found, len(key) + len(found), math.inf)
        return orjson.Fragment(found)

    def answer(
        self, name: str, request_id: str, run: Run, started: float, as_json: bool = False
    ) -> dict[str, Any]:
        """What /infer answers for a run (and a job's `result`); `started`, perf_counter.
        `as_json`: for a door answering with orjson (`result_to_serialise`)."""
        return {
            "id": request_id,
            "pipeline": name,
            "result": self.result_to_serialise(run) if as_json else self.result(run),
            "partial": run.partial,
            "steps": [s.__dict__ for s in run.steps],
            "latency_ms": ms(time.perf_counter() - started),
        }

    @contextlib.asynccontextmanager
    async def ticket(
        self, plan: Plan, deadline: float, background: float | None = None
    ) -> AsyncIterator[Ticket]:
        """One request of `plan`, counted under the status it ends with; 503 at once when the
        proxy holds its budget of bytes. Every byte the request held is released on exit.
        `background`: a job's, which waits for room within this share of the limits (the
        wait is not part of its budget) rather than being refused."""
        opened = time.perf_counter()
        ticket: Ticket | None = None
        outcome = Outcome()
        try:
            with recorded(plan.name, deadline, outcome):
                self.admission.check_room()
                ticket = Ticket(self, plan, deadline, self.admission.ledger(), background, opened)
                try:
                    yield ticket
                finally:
                    ticket.ledger.close()
        finally:
            if self.recent is not None or self.predictions is not None:
                if ticket is None:  # refused before it had one
                    ended = Ended(
                        plan.name, REQUEST_ID.get(), outcome.status, opened, [], plan=plan
                    )
                else:
                    ended = ticket.ended(outcome.status)
                if self.recent is not None:
                    self.recent.add(ended)
                if self.predictions is not None:
                    self.predictions.add(ended)


@dataclass
class Ticket:
    engine: Engine
    plan: Plan
    deadline: float
    """Absolute, loop time."""
    ledger: Ledger
    """The bytes the request holds, its body's from the first byte read."""
    background: float | None = None
    """A job's share of the admission limits (Engine.ticket)."""
    opened: float = field(default_factory=time.perf_counter)
    """When the proxy took the request (perf_counter)."""
    request_id: str = ""
    steps: list[StepStatus] = field(default_factory=list)
    """The steps run so far (kept here so that a failed run still tells them)."""
    answered: Run | None = None
    inputs: dict[str, np.ndarray] | None = None
    """The request's tensors, once read (what the prediction log describes)."""

    def ended(self, status: str) -> Ended:
        """The request, ended with HTTP `status`."""
        request_id = self.request_id or REQUEST_ID.get()
        return Ended(
            self.plan.name, request_id, status, self.opened, self.steps, self.answered,
            self.inputs, self.plan,
        )  # fmt: skip

    async def run(self, body: bytes, request_id: str) -> Run:
        """The uploaded body through the pipeline, once its format is accepted and the
        pipeline has room for its image (engine/room.py: it may wait for it); `body` is
        already on the ledger."""
        started = self.start(body, request_id)
        return started if isinstance(started, Run) else await started

    def start(self, body: bytes, request_id: str) -> Run | Coroutine[Any, Any, Run]:
        """`run`, begun: the answer kept in process for this body, found without waiting
        (a door answers it with no task and no turn of the loop: a hit's proxy CPU 186 ->
        177 us, bench/README), or the run to await."""
        plan = self.plan
        check_format(body, plan)
        width, height = media.declared_size(body) or (0, 0)
        upload = np.empty(1, dtype=object)
        upload[0] = body
        upload.setflags(False)  # never written: its cache digest is made once (cache/keys.py)
        inputs = self.inputs = {plan.pipeline.input: upload}
        key = None
        caches = self.engine.caches
        answers = None if caches is None else self._answers(caches)
        if answers is not None and self.background is None:
            made = pipeline_key_now(plan, caches.prints, inputs)  # type: ignore[union-attr]
            key = by_choice(made, plan.canaries, request_id)
            found = None if key is None else answers.hit_now(key)
            if found is not None:
                self.request_id = request_id
                self.answered = _shared(found, key)  # type: ignore[arg-type]
                return self.answered
        pixels = counted(plan, self.engine.catalog, body, width, height)
        return self._run(inputs, pixels, request_id, None if key is None else (answers, key))

    async def run_tensors(self, inputs: dict[str, np.ndarray], request_id: str) -> Run:
        """A pipeline's declared `inputs` through it: each checked against its declaration
        (400 naming the tensor), then held on the ledger."""
        check_tensors(self.plan, inputs)
        self.inputs = inputs
        self.ledger.hold(sum(content_bytes(a) for a in inputs.values()))
        return await self._run(inputs, 0, request_id)

    async def _run(
        self,
        inputs: dict[str, np.ndarray],
        pixels: int,
        request_id: str,
        looked_up: tuple[Answers[Run], bytes] | None = None,
    ) -> Run:
        """`looked_up`: the cache and key `start` found nothing kept for."""
        self.request_id = request_id
        if self.background is None:
            self.answered = await self._answer(inputs, pixels, request_id, looked_up)
            return self.answered
        admission, name = self.engine.admission, self.plan.name
        loop = asyncio.get_running_loop()
        waiting = loop.time()
        await admission.wait_background(name, pixels, self.background)
        self.deadline += loop.time() - waiting
        try:
            self.answered = await self._answer(inputs, pixels, request_id)
            return self.answered
        finally:
            admission.background_done(name, pixels)

    def _answers(self, caches: Caches) -> Answers[Run] | None:
        plan, admission = self.plan, self.engine.admission
        return caches.pipeline(plan, Run.entry, lambda e: Run.restored(plan, e, admission.ledger()))

    async def _answer(
        self,
        inputs: dict[str, np.ndarray],
        pixels: int,
        request_id: str,
        looked_up: tuple[Answers[Run], bytes] | None = None,
    ) -> Run:
        """The run, or the pipeline's cached answer (caches/answers.py: looked up before the
        run in process, beside it in Redis; identical requests in flight share one run)."""

        def compute() -> Awaitable[Run]:
            return self._execute(inputs, pixels, request_id)

        if looked_up is not None:
            answers, key = looked_up
        else:
            caches = self.engine.caches
            answers = None if caches is None else self._answers(caches)
            if answers is None:
                return await compute()
            # A model whose service cannot say its version now: no key, uncached.
            made = await pipeline_key(self.plan, caches.prints, inputs)  # type: ignore[union-attr]
            if (key := by_choice(made, self.plan.canaries, request_id)) is None:
                return await compute()
        run, how = await answers.answer(key, compute, self.deadline, looked_up is not None)
        if how == "miss":
            run.cache = "miss"
            return run
        return _shared(run, key)

    async def _execute(self, inputs: dict[str, np.ndarray], pixels: int, request_id: str) -> Run:
        background = self.background is not None
        left_s = self.deadline - asyncio.get_running_loop().time()
        async with self.engine.admission.admit(self.plan.name, pixels, background, left_s):
            run = Run(self.plan, request_id, self.deadline, self.ledger, steps=self.steps)
            run.origin = self.opened
            return await self.engine.executor.run(run, inputs)


def _shared(run: Run, key: bytes) -> Run:
    """A cached run, or one shared with the identical request that made it."""
    shared = copy.copy(run)
    shared.cache = "hit"
    shared.key = key
    return shared
