"""A client that hangs up cancels its request: every call the request has in flight is
cancelled at once (the services see CANCELLED) instead of running on for nobody."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from proxy.errors import ClientGone

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone (with `work` cancelled and finished) when the client
    disconnects first. Call it once the body has been read: the next message the server
    has for the request is then the disconnect. Work done within one turn of the loop (an
    in-process cache hit) is answered before any watch begins."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.sleep(0)  # one turn: work that never waits (a cache hit) is done now
    except BaseException:
        task.cancel()  # we ourselves were cancelled
        raise
    if task.done():  # no watcher, no wait: a third of a cache hit's door
        return task.result()
    gone = asyncio.ensure_future(_disconnected(request))
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
