"""How the proxy's HTTP protocol (proxy/doors/protocol.py) writes answers, on a real uvicorn
server: an answer's head and body in one write (uvicorn made two: two system calls, two TCP
segments, the reader woken twice), and a streamed answer's head not held back for its body."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from proxy.doors.protocol import GuardedHttpToolsProtocol

BODY = b"x" * 1500
head_read = asyncio.Event()
"""Set by the test once it has read a streamed answer's head: only then is its body sent."""


class _Recording:
    """A transport that passes everything on and records what was written, a list a write."""

    def __init__(self, transport: asyncio.Transport, writes: list[list[bytes]]) -> None:
        self._transport, self._writes = transport, writes

    def write(self, data: bytes) -> None:
        self._writes.append([bytes(data)])
        self._transport.write(data)

    def writelines(self, pieces: Any) -> None:
        pieces = [bytes(p) for p in pieces]
        self._writes.append(pieces)
        self._transport.writelines(pieces)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    head = {"type": "http.response.start", "status": 200, "headers": []}
    if scope["path"] == "/streamed":
        await send(head | {"headers": [(b"transfer-encoding", b"chunked")]})
        await head_read.wait()  # held with the body, the head would never come
        await send({"type": "http.response.body", "body": b"late", "more_body": False})
        return
    await send(head | {"headers": [(b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[list[bytes]]]]:
    writes: list[list[bytes]] = []

    class Recorded(GuardedHttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_Recording(transport, writes))  # type: ignore[arg-type]

    listening = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(_app, http=Recorded, lifespan="off", log_config=None, access_log=False)
    served = uvicorn.Server(config)
    serving = asyncio.create_task(served.serve(sockets=[listening]))
    try:
        yield listening.getsockname()[1], writes
    finally:
        served.should_exit = True
        await asyncio.wait_for(serving, 10)
        listening.close()


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    return head, await reader.readexactly(len(BODY))


async def test_an_answers_head_and_body_leave_in_one_write(server) -> None:
    """Two requests on one kept connection: each answer is one write, head then body, in
    order."""
    port, writes = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answers = []
        for _ in range(2):
            writer.write(b"GET /whole HTTP/1.1\r\nHost: t\r\n\r\n")
            answers.append(await asyncio.wait_for(_read_answer(reader), 5))
    finally:
        writer.close()
        await writer.wait_closed()
    for head, body in answers:
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == BODY
    assert len(writes) == 2, [[len(p) for p in w] for w in writes]
    for pieces in writes:
        joined = b"".join(pieces)
        assert joined.startswith(b"HTTP/1.1 200 OK\r\n") and joined.endswith(BODY)


async def test_a_streamed_answers_head_is_not_held_for_its_body(server) -> None:
    """The head of an answer whose body comes later leaves by the end of the event loop's
    turn, not with the body (here the body is sent only once the head was read)."""
    port, writes = server
    head_read.clear()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /streamed HTTP/1.1\r\nHost: t\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        head_read.set()
        rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    assert rest == b"4\r\nlate\r\n0\r\n\r\n"
    assert len(writes) == 2  # the head alone, then the body with the chunked end
