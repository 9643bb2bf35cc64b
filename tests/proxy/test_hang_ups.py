"""A client hanging up, seen through the proxy's own HTTP protocol (proxy/doors/protocol.py)
on a real uvicorn server: the work `until_disconnect` runs is cancelled once the client's
connection ends, whatever the size of the body it sent (uvicorn stops reading a connection
whose body overran its 64 KiB buffer, and then never sees the end of the stream unless the
connection is read again)."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn
from starlette.requests import Request

from proxy.doors.disconnect import until_disconnect
from proxy.doors.protocol import GuardedHttpToolsProtocol
from proxy.doors.uploads import UploadLimits, read_body
from proxy.errors import ClientGone


@pytest.mark.parametrize("size", [1_000, 1_000_000])
async def test_a_client_that_hangs_up_after_its_body_cancels_the_work(size: int) -> None:
    body_read, cancelled = asyncio.Event(), asyncio.Event()
    ended: list[str] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        request = Request(scope, receive)
        loop = asyncio.get_running_loop()
        body = await read_body(request, UploadLimits(max_bytes=2 * size), loop.time() + 30)
        assert len(body) == size
        body_read.set()

        async def slow() -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        try:
            await until_disconnect(request, slow())
        except ClientGone:
            ended.append("client gone")
            return
        ended.append("answered")

    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    config = uvicorn.Config(
        app, http=GuardedHttpToolsProtocol, lifespan="off", log_config=None, access_log=False
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: {size}\r\n\r\n".encode()
        writer.write(head + b"x" * size)
        await writer.drain()
        await asyncio.wait_for(body_read.wait(), 10)
        await asyncio.sleep(0.05)  # the work is under way
        writer.close()  # the client hangs up
        await asyncio.wait_for(cancelled.wait(), 5)
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.01)
        assert ended == ["client gone"]
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        listening.close()
