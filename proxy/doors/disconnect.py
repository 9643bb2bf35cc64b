"""A client that hangs up cancels its request: every call the request has in flight is
cancelled at once (the services see CANCELLED) instead of running on for nobody."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from proxy.doors.protocol import HANG_UP
from proxy.errors import ClientGone

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result, or ClientGone (with `work` cancelled and finished) when the client
    disconnects first. Behind the proxy's own HTTP protocol (proxy/doors/protocol.py) the
    connection says when it is lost; under another server a task reads `http.disconnect`
    (call this once the body has been read: the next message is then the disconnect),
    once `work` has had a turn of the loop to finish without waiting (a cache hit)."""
    # create_task, not ensure_future: that one asks a coroutine whether it is a future, an
    # AttributeError raised and dropped each time (~2,000 instructions).
    task = asyncio.create_task(work)
    watch: Callable[[Callable[[], None]], Callable[[], None]] | None = request.scope.get(
        "extensions", {}
    ).get(HANG_UP)
    try:
        if watch is None:
            return await _raced(request, task)
        left = False

        def hung_up() -> None:
            nonlocal left
            left = True
            task.cancel()

        unwatch = watch(hung_up)
        try:
            # Awaited directly: this caller cancelled cancels the task with it.
            return await task
        except asyncio.CancelledError:
            if left and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise ClientGone from None
            raise
        finally:
            unwatch()
    finally:
        # An error `work` raised goes on with this frame in its traceback, and the frame
        # would hold the task, which holds the error: a cycle only a full collection frees,
        # with the request's upload in it (22 refused OCR photos kept 400 MiB so).
        task = None  # type: ignore[assignment]


async def _raced(request: Request, task: asyncio.Task[T]) -> T:
    """`until_disconnect` under any other server: a task reads the disconnect."""
    gone: asyncio.Task[None] | None = None
    try:
        try:
            await asyncio.sleep(0)  # one turn: work that never waits (a cache hit) is done now
        except BaseException:
            task.cancel()  # we ourselves were cancelled
            raise
        if task.done():  # no watcher, no wait: a third of a cache hit's door
            return task.result()
        gone = asyncio.create_task(_disconnected(request))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise ClientGone
        finally:
            gone.cancel()
            if not task.done():  # we ourselves were cancelled
                task.cancel()
    finally:
        task = gone = None  # type: ignore[assignment]
