"""Where the prediction log's records go (proxy/engine/predictions.py):

- a file of JSON lines (`/path` or `file:///path`), rotated by size (`<file>.1` the newest of
  `BACKUPS` kept). Every proxy worker process appends to the same file under a lock, and the
  one that finds it full rotates it: whole lines, never two records interleaved. Log
  shippers (Fluent Bit, Vector, Filebeat) tail it as it is;
- an HTTP receiver (`http://` or `https://`), each record POSTed as a CloudEvent in binary
  mode (the `ce-*` headers, the record as the JSON body), as KServe's logger sends its
  events: a Knative broker, a collector's HTTP source, any web service. A record the receiver
  does not accept (not 2xx, refused, no answer within `TIMEOUT_S`) is counted as failed,
  never retried.
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

import httpx

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
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
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
                self._warned.warn("prediction log not sent", url=self.url, error=repr(exc))
                return False
        if not answer.is_success:
            self._warned.warn("prediction log refused", url=self.url, status=answer.status_code)
            return False
        return True

    async def close(self) -> None:
        await self._client.aclose()
