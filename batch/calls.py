"""One input through the mesh, as a client that means to be answered: transient refusals
(429, 502, 503, 504, a dropped connection) are retried with doubling back-off (the server's
Retry-After when it gives one); any other 4xx is the input's own fault and is never retried;
what still fails is recorded with the mesh's error. The door (REST here, gRPC in
grpc_door.py) only makes one attempt."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from batch import http1
from batch.sinks import Row
from batch.sources import Input, NotSent
from batch.window import FULL, Window

TRANSIENT = frozenset({429, 502, 503, 504})
CROWDED_MOST = 1000
"""Refusals of an input sent while the batch's own requests filled the mesh, at most: they
spend none of its attempts (batch/window.py), and the window closes on each, so this is
only a bound, never met while the mesh answers anything."""


@dataclass(frozen=True)
class Retry:
    attempts: int = 5
    """Tries per input, the first included."""
    first_s: float = 0.5
    most_s: float = 10.0

    def delay_s(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None:
            try:
                return min(self.most_s, max(0.0, float(retry_after)))
            except ValueError:
                pass
        base = min(self.most_s, self.first_s * 2 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)  # jittered: retries do not arrive together


@dataclass(frozen=True)
class Attempt:
    """One try's outcome, whatever the door."""

    status: int | None
    """The HTTP status (the REST door's for the same failure, on gRPC); None: no answer (a
    dropped connection or stream), which is retried."""
    result: Any = None
    """What /infer answers, when status is 200."""
    error: dict | None = None
    retry_after: str | None = None


Send = Callable[[Input, bytes], Awaitable[Attempt]]


def request_id(item: Input) -> str:
    """The key names the request in the mesh's logs (ASCII: a header, gRPC metadata)."""
    return quote(f"batch-{item.key}", safe="/._-:")[:128]


async def infer(
    send: Send, item: Input, retry: Retry, max_bytes: int, window: Window | None = None
) -> Row:
    """`item` through the mesh, its transient failures tried `retry.attempts` times, each
    request within `window` (batch/window.py)."""
    if item.problem is not None:
        error = {"status": None, "error": item.problem}
        return Row(item.key, "failed", None, error=error, extra=item.extra)
    try:
        data = await item.read(max_bytes)
    except (OSError, NotSent) as exc:
        why = str(exc) if isinstance(exc, NotSent) else f"cannot read {item.path}: {exc.strerror}"
        return Row(item.key, "failed", None, error={"status": None, "error": why}, extra=item.extra)
    error: dict = {}
    window = window or Window(1 << 30)
    attempt, crowded = 1, 0
    while True:
        started = time.perf_counter()
        async with window.slot():
            got = await send(item, data)
        latency_ms = round((time.perf_counter() - started) * 1000, 2)
        if got.status in FULL and window.refused() and crowded < CROWDED_MOST:
            crowded += 1  # the batch's own requests filled the mesh: sent again, in its turn
            continue
        if got.status not in FULL:
            window.answered()
        if got.status == 200:
            return Row(item.key, "ok", latency_ms, result=got.result, extra=item.extra)
        error = got.error or {"status": got.status, "error": "no answer"}
        if got.status is not None and got.status not in TRANSIENT:
            return Row(item.key, "failed", latency_ms, error=error, extra=item.extra)
        if attempt >= retry.attempts:
            break
        await asyncio.sleep(retry.delay_s(attempt, got.retry_after))
        attempt += 1
    error["attempts"] = retry.attempts
    return Row(item.key, "failed", None, error=error, extra=item.extra)


def _error(status: int, body: bytes) -> dict:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    message = parsed.get("error") if isinstance(parsed, dict) else None
    return {"status": status, "error": message or body[:500].decode(errors="replace")}


class RestDoor:
    """POST /v1/pipelines/{name}/infer, the image as the body."""

    def __init__(self, client: http1.Client, pipeline: str) -> None:
        self.client = client
        self.path = f"/v1/pipelines/{quote(pipeline)}/infer"

    async def send(self, item: Input, data: bytes) -> Attempt:
        headers = {"Content-Type": "application/octet-stream", "X-Request-Id": request_id(item)}
        try:
            answer = await self.client.request("POST", self.path, data, headers)
        except http1.NoAnswer as exc:
            return Attempt(None, error={"status": None, "error": str(exc)})
        if answer.status == 200:
            return Attempt(200, result=orjson.loads(answer.body))
        return Attempt(
            answer.status,
            error=_error(answer.status, answer.body),
            retry_after=answer.headers.get("retry-after"),
        )

    async def close(self) -> None:
        self.client.close()
