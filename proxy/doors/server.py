"""uvicorn's server, woken less when idle.

Its main loop wakes every 0.1 s to see whether it was told to stop, and every tenth time to
date its answers: 10 of the ~25 wake-ups a second of an idle proxy, each costing ~2-3 ms of
CPU on a machine whose cores sleep between them. This one wakes once a second (the date
header keeps its one-second resolution) and at once when a signal tells it to stop."""

from __future__ import annotations

import asyncio
import contextlib
from types import FrameType

import uvicorn

TICK_S = 1.0


class Server(uvicorn.Server):
    _exit: asyncio.Event | None = None

    async def main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._exit, self._loop = asyncio.Event(), loop
        if self.should_exit:
            self._exit.set()
        counter = 0  # a multiple of 10: uvicorn's on_tick dates the answers each time
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), TICK_S)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._exit is not None:  # from a signal handler: through the loop's own wake-up
            self._loop.call_soon_threadsafe(self._exit.set)
