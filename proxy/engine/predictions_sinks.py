"""Where the prediction log's records go (proxy/engine/predictions.py):

- a file of JSON lines (`/path` or `file:///path`), rotated by size (`<file>.1` the newest of
  `BACKUPS` kept). Every proxy worker process appends to the same file under a lock, and the
  one that finds it full rotates it: whole lines, never two records interleaved. Log
  shippers (Fluent Bit, Vector, Filebeat) tail it as it is;
- an HTTP receiver (`http://` or `https://`), each record POSTed as a CloudEvent in binary
  mode (the `ce-*` headers, the record as the JSON body), as KServe's logger sends its
  events: a Knative broker, a collector's HTTP source, any web service. A record the receiver
  does not accept (not 2xx, refused, no answer within `TIMEOUT_S`) is counted as failed,
  never retried;
- a Redis stream (`redis://host:6379/0?stream=mesh:predictions&maxlen=100000`, or
  `rediss://`): each record one entry (`XADD`, fields `id`, `pipeline`, `time` and `record`,
  the JSON), a batch in one round trip, the stream trimmed to about `maxlen` entries. Any
  number of consumers read it (`XREAD`, or `XREADGROUP` for a group sharing the work), each
  at its own pace: the queue the jobs and the caches already use, without a collector.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from redis.exceptions import RedisError

from proxy.engine import redis_client

log = logging.getLogger("proxy.predictions")

BACKUPS = 5
"""Rotated files kept beside the one being written."""
TIMEOUT_S = 5.0
"""An HTTP receiver's time to accept a record."""
PARALLEL = 8
"""Records POSTed at once to an HTTP receiver."""
WARN_EVERY_S = 60.0
"""A failing sink is logged at most this often (its records are counted each time)."""
CLOUDEVENT_TYPE = "io.inference-mesh.prediction"
STREAM = "mesh:predictions"
"""A Redis sink's stream unless its URL names one (`?stream=`)."""
MAXLEN = 100_000
"""A Redis sink's stream is trimmed to about this many entries unless its URL says
(`?maxlen=`): a consumer that stops never fills Redis's memory."""


@dataclass(frozen=True, slots=True)
class Line:
    """A record as JSON, and what a CloudEvent's headers say of it."""

    request_id: str
    pipeline: str
    time: str
    json: bytes


class Sink(Protocol):
    async def write(self, lines: list[Line]) -> int:
        """Write `lines`; how many were written."""
        ...

    async def close(self) -> None: ...


def sink_for(url: str, max_file_mb: float = 100.0) -> Sink:
    """The sink a PROXY_PREDICTION_LOG value names (checked by the settings first)."""
    if url.startswith(("http://", "https://")):
        return HttpSink(url)
    if url.startswith(("redis://", "rediss://")):
        return RedisSink(*redis_stream(url))
    return FileSink(Path(url.removeprefix("file://")), int(max_file_mb * 2**20))


class _Warned:
    """A failing sink's warning, at most once every WARN_EVERY_S."""

    def __init__(self) -> None:
        self._last = -WARN_EVERY_S

    def warn(self, message: str, **fields: object) -> None:
        now = time.monotonic()
        if now - self._last >= WARN_EVERY_S:
            self._last = now
            log.warning(message, extra={"fields": fields})


class FileSink:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._fd: int | None = None
        self._lock: int | None = None
        self._warned = _Warned()

    async def write(self, lines: list[Line]) -> int:
        if not lines:
            return 0
        blob = b"".join(line.json for line in lines)
        try:
            await asyncio.to_thread(self._append, blob)
        except OSError as exc:
            self._warned.warn("prediction log not written", file=str(self.path), error=repr(exc))
            return 0
        return len(lines)

    def _append(self, blob: bytes) -> None:
        if self._lock is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = os.open(f"{self.path}.lock", os.O_WRONLY | os.O_CREAT, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            fd = self._current()
            start = os.fstat(fd).st_size
            view = memoryview(blob)
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                # A write cut short (a full disk) left part of a line, which the next batch
                # would have completed with another record's: one line no reader can parse.
                os.ftruncate(fd, start)
                raise
            if os.fstat(fd).st_size >= self._max_bytes:
                self._rotate()
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def _current(self) -> int:
        """The file's descriptor, opened again if another process rotated it away."""
        fd = self._fd
        if fd is not None:
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _rotate(self) -> None:
        for i in range(BACKUPS - 1, 0, -1):
            older = Path(f"{self.path}.{i}")
            if older.exists():
                older.replace(f"{self.path}.{i + 1}")
        self.path.replace(f"{self.path}.1")
        self._current()

    async def close(self) -> None:
        for fd in (self._fd, self._lock):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock = None


class HttpSink:
    def __init__(self, url: str) -> None:
        self.url = url
        self._shown = redis_client.shown(url)  # logged without a user:password@ it carries
        self._client = httpx.AsyncClient(timeout=TIMEOUT_S)
        self._room = asyncio.Semaphore(PARALLEL)
        self._warned = _Warned()

    async def write(self, lines: list[Line]) -> int:
        sent = await asyncio.gather(*(self._post(line) for line in lines))
        return sum(sent)

    async def _post(self, line: Line) -> bool:
        headers = {
            "Content-Type": "application/json",
            "ce-specversion": "1.0",
            "ce-id": uuid.uuid4().hex,
            "ce-source": f"/inference-mesh/pipelines/{line.pipeline}",
            "ce-type": CLOUDEVENT_TYPE,
            "ce-time": line.time,
            "ce-requestid": line.request_id,
        }
        async with self._room:
            try:
                answer = await self._client.post(self.url, content=line.json, headers=headers)
            except httpx.HTTPError as exc:
                self._warned.warn("prediction log not sent", url=self._shown, error=repr(exc))
                return False
        if not answer.is_success:
            self._warned.warn("prediction log refused", url=self._shown, status=answer.status_code)
            return False
        return True

    async def close(self) -> None:
        await self._client.aclose()


def redis_stream(url: str) -> tuple[str, str, int]:
    """A Redis sink's URL as Redis's own (its `stream` and `maxlen` taken out), the stream's
    key and its length; ValueError naming what is wrong."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in ("stream", "maxlen")}
    stream = ours.get("stream", STREAM)
    if not stream:
        raise ValueError(f"'{redis_client.shown(url)}' names an empty stream")
    try:
        maxlen = int(ours.get("maxlen", MAXLEN))
    except ValueError:
        maxlen = 0
    if maxlen < 1:
        raise ValueError(f"'{redis_client.shown(url)}': maxlen must be a whole number above 0")
    rest = urlencode([(k, v) for k, v in query if k not in ours])
    return urlunsplit(parts._replace(query=rest)), stream, maxlen


class RedisSink:
    def __init__(self, url: str, stream: str, maxlen: int) -> None:
        self.url = redis_client.shown(url)
        self.stream = stream
        self.maxlen = maxlen
        # One retry on a connection Redis closed (a restart); a record sent twice then is
        # told by its `id`.
        self._redis = redis_client.connect(url, TIMEOUT_S, retries=1, backoff=False)
        self._warned = _Warned()

    async def write(self, lines: list[Line]) -> int:
        if not lines:
            return 0
        batch = self._redis.pipeline(transaction=False)
        for line in lines:
            fields = {"id": line.request_id, "pipeline": line.pipeline, "time": line.time}
            fields["record"] = line.json  # type: ignore[assignment]
            batch.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)
        try:
            results = await batch.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            self._warned.warn("prediction log not sent", redis=self.url, error=repr(exc))
            return 0
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            self._warned.warn("prediction log refused", redis=self.url, error=repr(failed[0]))
        return len(results) - len(failed)

    async def close(self) -> None:
        await self._redis.aclose()
