"""One input through the mesh's REST door, as a client that means to be answered: transient
refusals (429, 503, 504, a dropped connection) are retried with doubling back-off (the
server's Retry-After when it gives one); any other 4xx is the input's own fault and is never
retried; what still fails is recorded with the mesh's error."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
import orjson

from batch.sinks import Row
from batch.sources import Input

TRANSIENT = frozenset({429, 502, 503, 504})


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


def _error(status: int, body: bytes) -> dict:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    message = parsed.get("error") if isinstance(parsed, dict) else None
    return {"status": status, "error": message or body[:500].decode(errors="replace")}


async def infer(session: aiohttp.ClientSession, pipeline: str, item: Input, retry: Retry) -> Row:
    if item.problem is not None:
        return Row(
            item.key,
            "failed",
            None,
            error={"status": None, "error": item.problem},
            extra=item.extra,
        )
    try:
        data = item.read() if item.small() else await asyncio.to_thread(item.read)
    except OSError as exc:
        error = {"status": None, "error": f"cannot read {item.path}: {exc.strerror}"}
        return Row(item.key, "failed", None, error=error, extra=item.extra)
    path = f"/v1/pipelines/{pipeline}/infer"
    headers = {
        "Content-Type": "application/octet-stream",
        # The key names the request in the mesh's logs (ASCII: a header)
        "X-Request-Id": quote(f"batch-{item.key}", safe="/._-:")[:128],
    }
    error: dict = {}
    for attempt in range(1, retry.attempts + 1):
        started = time.perf_counter()
        retry_after = None
        try:
            async with session.post(path, data=data, headers=headers) as answer:
                status, body = answer.status, await answer.read()
                retry_after = answer.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = {"status": None, "error": f"{type(exc).__name__}: {exc}"}
        else:
            latency_ms = round((time.perf_counter() - started) * 1000, 2)
            if status == 200:
                return Row(item.key, "ok", latency_ms, result=orjson.loads(body), extra=item.extra)
            error = _error(status, body)
            if status not in TRANSIENT:
                return Row(item.key, "failed", latency_ms, error=error, extra=item.extra)
        if attempt < retry.attempts:
            await asyncio.sleep(retry.delay_s(attempt, retry_after))
    error["attempts"] = retry.attempts
    return Row(item.key, "failed", None, error=error, extra=item.extra)
