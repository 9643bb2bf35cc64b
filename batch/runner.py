"""A batch run: the source streamed through a bounded set of callers (`concurrency` requests
in flight, at most `rate` started per second), each answer appended to the sink as it
arrives. Inputs the sink already holds are skipped, so a rerun after a kill or Ctrl-C sends
only what was not answered (at most the requests that were in flight); with `retry_failed`,
also those an earlier run gave up on."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson

from batch import calls, http1
from batch.progress import Progress
from batch.sinks import Sink
from batch.sources import MAX_FILE_BYTES, Input, Source
from batch.window import Window

if TYPE_CHECKING:
    from batch.grpc_door import GrpcDoor


class MeshError(RuntimeError):
    """The mesh cannot run this batch at all (unreachable, no such pipeline)."""


@dataclass(frozen=True)
class Options:
    url: str
    pipeline: str
    door: str = "rest"
    """`rest` (/v1/pipelines/{name}/infer) or `grpc` (the gRPC door's streams)."""
    grpc_address: str | None = None
    """The gRPC door's host:port; None: --url's host, port 8081."""
    api_key: str | None = None
    concurrency: int = 32
    rate: float | None = None
    """Requests started per second at most (None: as fast as answers come)."""
    retry: calls.Retry = field(default_factory=calls.Retry)
    timeout_s: float = 120.0
    progress_every_s: float = 10.0
    max_file_bytes: int = MAX_FILE_BYTES
    retry_failed: bool = False
    """Send again the inputs earlier runs gave up on (batch/sinks.py: gave_up)."""


class _Pace:
    """At most `rate` starts per second, spread evenly."""

    def __init__(self, rate: float | None) -> None:
        self._gap = 1.0 / rate if rate else 0.0
        self._next = time.monotonic()

    async def wait(self) -> None:
        if not self._gap:
            return
        now = time.monotonic()
        slot, self._next = max(now, self._next), max(now, self._next) + self._gap
        if slot > now:
            await asyncio.sleep(slot - now)


async def check_pipeline(client: http1.Client, url: str, pipeline: str) -> None:
    try:
        answer = await client.request("GET", "/v1/pipelines")
    except http1.NoAnswer as exc:
        raise MeshError(f"the mesh at {url} cannot be reached: {exc}") from None
    if answer.status != 200:
        raise MeshError(f"{url}/v1/pipelines answered {answer.status}")
    pipelines = orjson.loads(answer.body)
    if pipeline not in pipelines:
        known = ", ".join(sorted(pipelines))
        raise MeshError(f"the mesh has no pipeline '{pipeline}' (it has: {known})")


async def run(source: Source, sink: Sink, options: Options) -> Progress:
    """Every input of `source` not in `sink` yet through the mesh; the sink is closed (its
    rows flushed and synced) however the run ends."""
    try:
        return await _run(source, sink, options)
    finally:
        sink.close()


async def _run(source: Source, sink: Sink, options: Options) -> Progress:
    retried = await asyncio.to_thread(sink.forget_given_up) if options.retry_failed else 0
    done = sink.answered()
    progress = Progress(await asyncio.to_thread(source.count), every_s=options.progress_every_s)
    progress.counts["retried"] = retried
    queue: asyncio.Queue[Input | None] = asyncio.Queue(maxsize=2 * options.concurrency)
    pace = _Pace(options.rate)
    window = Window(options.concurrency)
    door: calls.RestDoor | GrpcDoor
    if options.door == "grpc":
        door = await _grpc_door(options)
    else:
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
        try:
            client = http1.Client(options.url, options.timeout_s, headers)
        except ValueError as exc:
            raise MeshError(str(exc)) from None
        try:
            await check_pipeline(client, options.url, options.pipeline)
        except MeshError:
            client.close()
            raise
        door = calls.RestDoor(client, options.pipeline)

    async def feed() -> None:
        for item in source:
            if item.key in done:  # answered by an earlier run, or listed twice
                progress.skipped()
                continue
            done.add(item.key)
            await queue.put(item)
        for _ in range(options.concurrency):
            await queue.put(None)

    async def call() -> None:
        while (item := await queue.get()) is not None:
            await pace.wait()
            row = await calls.infer(door.send, item, options.retry, options.max_file_bytes, window)
            sink.write(row)
            progress.answered(row.status)

    tasks = [
        asyncio.create_task(feed()),
        *(asyncio.create_task(call()) for _ in range(options.concurrency)),
    ]
    try:
        await asyncio.gather(*tasks)
    finally:
        # One that failed (the output cannot be written) stops the others before the door
        # closes: gather left them running, their connections left open.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await door.close()
        if window.narrowest < window.most:
            progress.narrowed = (window.narrowest, window.most)
    return progress


async def _grpc_door(options: Options) -> GrpcDoor:
    from batch.grpc_door import DoorError, GrpcDoor  # grpc only when asked for

    url = urlsplit(options.url)
    door = GrpcDoor(
        options.grpc_address or f"{url.hostname or '127.0.0.1'}:8081",
        options.pipeline,
        options.concurrency,
        options.timeout_s,
        tls=url.scheme == "https",
        api_key=options.api_key,
    )
    try:
        await door.check()
    except DoorError as exc:
        await door.close()
        raise MeshError(str(exc)) from None
    return door
