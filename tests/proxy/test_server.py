"""The proxy's uvicorn server: its main loop wakes once a second when idle, not ten times
(each wake-up of an idle process cost ~2-3 ms of CPU here), and a stop signal still ends it
at once rather than at its next tick."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable

import pytest
import uvicorn

from proxy.doors import server as server_module
from proxy.doors.server import Server


async def app(scope: dict, receive: object, send: Callable) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_an_idle_server_ticks_once_a_second_and_stops_when_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks: list[int] = []
    on_tick = Server.on_tick

    async def counted(self: Server, counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(self, counter)

    monkeypatch.setattr(Server, "on_tick", counted)
    listening = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    server = Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        await asyncio.sleep(2.5)
        assert 2 <= len(ticks) <= 4, ticks  # uvicorn's own loop: 25
        assert all(counter % 10 == 0 for counter in ticks)  # each one dates the answers
        monkeypatch.setattr(server_module, "TICK_S", 3600.0)
        await asyncio.sleep(1.2)  # now waiting out an hour's tick
        server.handle_exit(signal.SIGTERM, None)
        server._captured_signals.clear()  # uvicorn raises them again once stopped: not here
        await asyncio.wait_for(serving, 10)  # at once, not in an hour
    finally:
        server.should_exit = True
        if not serving.done():
            serving.cancel()
        listening.close()
