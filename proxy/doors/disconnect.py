"""A client that hangs up cancels its request: every call the request has in flight is
cancelled at once (the services see CANCELLED) instead of running on for nobody."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from proxy.errors import ClientGone

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result, or ClientGone (with `work` cancelled and finished) when the client
    disconnects first. Call it once the body has been read: the next message the server
    has for the request is then the disconnect. Work done within one turn of the loop (an
    in-process cache hit) is answered before any watch begins."""
    # create_task, not ensure_future: that one asks a coroutine whether it is a future, an
    # AttributeError raised and dropped each time (~2,000 instructions).
    task = asyncio.create_task(work)
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
        # An error `work` raised goes on with this frame in its traceback, and the frame
        # would hold the task, which holds the error: a cycle only a full collection frees,
        # with the request's upload in it (22 refused OCR photos kept 400 MiB so).
        task = gone = None  # type: ignore[assignment]
