"""A batch run: the source streamed through a bounded set of callers (`concurrency` requests
in flight, at most `rate` started per second), each answer appended to the sink as it
arrives. Inputs the sink already holds are skipped, so a rerun after a kill or Ctrl-C sends
only what was not answered (at most the requests that were in flight)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass, field

import httpx

from batch import calls
from batch.progress import Progress
from batch.sinks import Sink
from batch.sources import Input, Source


class MeshError(RuntimeError):
    """The mesh cannot run this batch at all (unreachable, no such pipeline)."""


@dataclass(frozen=True)
class Options:
    url: str
    pipeline: str
    concurrency: int = 32
    rate: float | None = None
    """Requests started per second at most (None: as fast as answers come)."""
    retry: calls.Retry = field(default_factory=calls.Retry)
    timeout_s: float = 120.0
    progress_every_s: float = 10.0


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


async def check_pipeline(client: httpx.AsyncClient, pipeline: str) -> None:
    try:
        listing = await client.get("/v1/pipelines")
    except httpx.TransportError as exc:
        raise MeshError(f"the mesh at {client.base_url} cannot be reached: {exc}") from None
    if listing.status_code != 200:
        raise MeshError(f"{client.base_url}/v1/pipelines answered {listing.status_code}")
    if pipeline not in listing.json():
        known = ", ".join(sorted(listing.json()))
        raise MeshError(f"the mesh has no pipeline '{pipeline}' (it has: {known})")


async def run(source: Source, sink: Sink, options: Options) -> Progress:
    done = sink.answered()
    progress = Progress(await asyncio.to_thread(source.count), every_s=options.progress_every_s)
    timeout = httpx.Timeout(options.timeout_s, connect=10.0)
    queue: asyncio.Queue[Input | None] = asyncio.Queue(maxsize=2 * options.concurrency)
    pace = _Pace(options.rate)
    # A client (one keep-alive connection) per caller: httpcore's pool looks at every one of
    # its connections on every request (a getpeername and a poll each), which held 32 callers
    # sharing one pool to ~180 requests/s.
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tls = ssl.create_default_context()  # one for all (each made its own: 20 ms apiece)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=options.url, limits=one, timeout=timeout, verify=tls)
            )
            for _ in range(options.concurrency)
        ]
        await check_pipeline(clients[0], options.pipeline)

        async def feed() -> None:
            for item in source:
                if item.key in done:  # answered by an earlier run, or listed twice
                    progress.skipped()
                    continue
                done.add(item.key)
                await queue.put(item)
            for _ in range(options.concurrency):
                await queue.put(None)

        async def call(client: httpx.AsyncClient) -> None:
            while (item := await queue.get()) is not None:
                await pace.wait()
                row = await calls.infer(client, options.pipeline, item, options.retry)
                sink.write(row)
                progress.answered(row.status)

        try:
            await asyncio.gather(feed(), *(call(c) for c in clients))
        finally:
            sink.close()
    return progress
