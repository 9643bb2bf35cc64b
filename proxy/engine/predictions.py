"""The prediction log (the serving patterns' prediction log; KServe's InferenceService `logger`,
Seldon Core's request logging): each request a pipeline ended, as one JSON record written in
the background to a file, POSTed to an HTTP receiver as a CloudEvent, or added to a Redis
stream. It says what was asked (each input's datatype, shape, size and SHA-256, and with
`inputs` on its bytes), what was answered (the `/v1` result, partial or not, from the cache or
not), which model answered each step (`variant`, for canaries) and how long it took: what drift
monitoring, audits and the next training set read.

A request never waits for its record and never fails for it: a record is made once its
request has been answered, and queued in memory as JSON, bounded in number and bytes; beyond
the bound, or when the sink fails, a record is dropped and counted
(`proxy_prediction_log_records_total{outcome}`).
Records still queued when the proxy stops are written first (up to `CLOSE_S`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import logging
import random
import time
from collections.abc import Callable

import numpy as np
import orjson

from protos import codec
from protos.metric_types import Counter
from proxy.engine.canaries import answered_by
from proxy.engine.plan import Plan
from proxy.engine.predictions_sinks import Line, Sink
from proxy.engine.run import Ended, Run, StepStatus, ms
from proxy.transport.target import Target

log = logging.getLogger("proxy.predictions")

MAX_QUEUED = 4096
"""Records waiting to be written, per process."""
MAX_QUEUED_BYTES = 64 << 20
"""Bytes of JSON the waiting records hold (with `inputs` on, their uploads' bytes)."""
BATCH = 256
"""Records written together at most (one write of a file, or posts at once)."""
LINGER_S = 0.05
"""How long the first record of a batch waits for others: one write (one thread hop, one
lock, one system call) for every record that came meanwhile, not one each."""
CLOSE_S = 5.0
"""On shutdown, how long the records still queued may take to be written."""
OFF_LOOP_BYTES = 1 << 20
"""Inputs of more bytes than this are described (hashed, and encoded when kept) in a worker
thread: a 20 MiB upload's SHA-256 takes ~15 ms, which on the loop would hold every request."""
LISTED = 64
"""A BYTES tensor of up to this many elements is described element by element; a larger one
as a whole, by its v2 contents (5 million elements hashed one by one took seconds)."""

RECORDS = Counter(
    "proxy_prediction_log_records_total",
    "Records of the prediction log (PROXY_PREDICTION_LOG) by outcome: written, dropped (the "
    "queue was full) or failed (the sink refused or could not be reached)",
    ["outcome"],
)


class PredictionLog:
    """The records of this process, queued for their sink."""

    def __init__(
        self,
        sink: Sink,
        render: Callable[[Run], object],
        percent: float = 100.0,
        with_inputs: bool = False,
        max_input_bytes: int = 1 << 20,
        digest: Callable[[Target], str | None] = lambda target: None,
    ) -> None:
        self._sink = sink
        self._render = render
        self._percent = percent
        self._with_inputs = with_inputs
        self._max_input_bytes = max_input_bytes
        self._digest = digest
        """A model's SHA-256 as its service reports it (None: not reported, or not known)."""
        self._queue: asyncio.Queue[Line | None] = asyncio.Queue()  # None: stop
        self._bytes = 0
        self._writer: asyncio.Task[None] | None = None
        self._describing: set[asyncio.Task[None]] = set()
        """Records whose large inputs are being described in a thread."""
        for outcome in ("written", "dropped", "failed"):  # at 0 from the first scrape on
            RECORDS.labels(outcome)

    def add(self, ended: Ended) -> None:
        """A request that ended; returns at once."""
        if self._percent < 100 and random.random() * 100 >= self._percent:
            return
        waiting = self._queue.qsize() + len(self._describing)
        if waiting >= MAX_QUEUED or self._bytes >= MAX_QUEUED_BYTES:
            RECORDS.labels("dropped").inc()
            return
        latency = ms(time.perf_counter() - ended.opened)
        # Made at the loop's next turn, once the door has answered; then only its JSON is
        # kept, so no request's tensors outlive it and the bound counts what is written.
        asyncio.get_running_loop().call_soon(self._made, ended, time.time(), latency)

    def _made(self, ended: Ended, at: float, latency_ms: float) -> None:
        inputs = ended.inputs or {}
        held = _held(inputs)
        if held is None:
            self._queued(ended, at, latency_ms, None)
            return
        task = asyncio.get_running_loop().create_task(self._described(ended, at, latency_ms, held))
        self._describing.add(task)
        task.add_done_callback(self._describing.discard)

    async def _described(self, ended: Ended, at: float, latency_ms: float, held: int) -> None:
        """The record of large inputs, described in a thread; their bytes count against the
        bound meanwhile."""
        self._bytes += held
        try:
            described = await asyncio.to_thread(self._inputs, ended.inputs or {})
        except Exception as exc:
            described = exc
        finally:
            self._bytes -= held
        self._queued(ended, at, latency_ms, described)

    def _queued(
        self,
        ended: Ended,
        at: float,
        latency_ms: float,
        described: dict[str, dict] | Exception | None,
    ) -> None:
        try:
            if isinstance(described, Exception):
                raise described
            line = self.record(ended, at, latency_ms, described)
        except Exception as exc:  # a record that cannot be made never stops the log
            RECORDS.labels("failed").inc()
            log.warning("prediction record failed", extra={"fields": {"error": repr(exc)}})
            return
        self._bytes += len(line.json)
        self._queue.put_nowait(line)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        """Until told to stop: what is queued, a batch at a time."""
        stopping = False
        while not stopping:
            batch = [await self._queue.get()]
            if batch[0] is not None:
                await asyncio.sleep(LINGER_S)  # the records that come meanwhile: one write
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            lines = [line for line in batch if line is not None]
            stopping = len(lines) < len(batch)
            self._bytes -= sum(len(line.json) for line in lines)
            try:
                written = await self._sink.write(lines)
            except Exception as exc:  # a sink's unforeseen error: its records count as failed
                written = 0
                log.warning("prediction log failed", extra={"fields": {"error": repr(exc)}})
            RECORDS.labels("written").inc(written)
            if written < len(lines):
                RECORDS.labels("failed").inc(len(lines) - written)

    def record(
        self,
        ended: Ended,
        at: float,
        latency_ms: float,
        described: dict[str, dict] | None = None,
    ) -> Line:
        """One request as a JSON line (`at`: time.time() when it ended; `described`: its
        inputs', when already made)."""
        run = ended.run
        answered = ended.status == "200" and run is not None
        record = {
            "id": ended.request_id,
            "pipeline": ended.pipeline,
            "time": _iso(at - latency_ms / 1000),
            "status": int(ended.status),
            "latency_ms": latency_ms,
            "inputs": self._inputs(ended.inputs or {}) if described is None else described,
            "result": self._render(run) if answered else None,  # type: ignore[arg-type]
            "partial": run.partial if answered else None,  # type: ignore[union-attr]
            "cache": None if run is None else run.cache,
            "steps": [self._step(s, ended.plan) for s in ended.steps],
        }
        line = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        return Line(ended.request_id, ended.pipeline, record["time"], line)

    def _inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, dict]:
        """Each input's datatype and shape; its size, SHA-256 and (asked for, small enough)
        bytes: a BYTES tensor's of up to LISTED elements element by element, as lists (an
        upload is one element: its digest is the file's, as `sha256sum` gives it), any
        other's over its v2 contents (a BYTES one's: each element's 4-byte length, then its
        bytes)."""
        out = {}
        for name, array in inputs.items():
            datatype = codec.datatype_of(array)
            described: dict = {"datatype": datatype, "shape": list(array.shape)}
            if datatype == "BYTES" and array.size <= LISTED:
                elements = [v if isinstance(v, bytes) else str(v).encode() for v in array.flat]
                described["bytes"] = [len(e) for e in elements]
                described["sha256"] = [hashlib.sha256(e).hexdigest() for e in elements]
                size = sum(described["bytes"])
            else:
                raw = codec.to_raw_view(array)[1]
                described["bytes"] = size = len(raw)
                described["sha256"] = hashlib.sha256(raw).hexdigest()
            if self._with_inputs and size <= self._max_input_bytes:
                if isinstance(described["sha256"], list):
                    described["data_base64"] = [base64.b64encode(e).decode() for e in elements]
                else:
                    described["data_base64"] = base64.b64encode(raw).decode()
            out[name] = described
        return out

    def _step(self, step: StepStatus, plan: Plan | None) -> dict:
        """A step's status, and for a call the model that answered it: its name, the version
        asked for (if any), and the SHA-256 of its files as its service reports it
        (`mesh.sha256` in its configuration's parameters, as last known), which tells a
        model replaced in place apart."""
        out: dict = {"name": step.name, "status": step.status, "latency_ms": step.latency_ms}
        if step.error is not None:
            out["error"] = step.error
        if step.variant is not None:
            out["variant"] = step.variant
        if step.cache is not None:
            out["cache"] = step.cache
        target = None if plan is None else answered_by(plan, step.name, step.variant)
        if target is not None:
            out["model"] = target.model
            if target.version:
                out["model_version"] = target.version
            if (digest := self._digest(target)) is not None:
                out["model_sha256"] = digest
        return out

    async def close(self) -> None:
        """Write what is queued (for up to CLOSE_S; what is left then is dropped), then stop."""
        await asyncio.sleep(0)  # the records made at this turn (Engine.ticket's last ones)
        if self._describing:
            _, late = await asyncio.wait(set(self._describing), timeout=CLOSE_S)
            for task in late:
                task.cancel()
            RECORDS.labels("dropped").inc(len(late))
        writer = self._writer
        if writer is not None:
            self._queue.put_nowait(None)
            try:
                await asyncio.wait_for(writer, CLOSE_S)
            except TimeoutError:
                RECORDS.labels("dropped").inc(self._queue.qsize())
        await self._sink.close()


def _iso(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _held(inputs: dict[str, np.ndarray]) -> int | None:
    """The bytes of `inputs` when they are to be described off the loop (over OFF_LOOP_BYTES,
    or a BYTES tensor of more than LISTED elements); None: on the loop, at once."""
    size = 0
    for array in inputs.values():
        if array.dtype == object and array.size > LISTED:  # counting its bytes is a loop
            return size + 4 * array.size  # its length prefixes, at least
        size += codec.content_bytes(array)
    return size if size > OFF_LOOP_BYTES else None
