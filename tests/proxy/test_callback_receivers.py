"""A callback's try against receivers that misbehave, over real sockets: one that streams an
endless answer, and one that sends its answer's head a byte at a time. Each try ends within
its bound and reads no more than the receiver's status line and headers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from proxy.jobs import callbacks

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)


@pytest.fixture
async def receiver() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[str, dict]]]]:
    servers: list[asyncio.Server] = []

    async def serve(handler: Handler) -> tuple[str, dict]:
        sent = {"bytes": 0}

        async def wrapped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await _read_request(reader)
                await handler(writer, sent)  # type: ignore[arg-type]
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(wrapped, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/done", sent

    yield serve
    for server in servers:
        server.close()


async def test_an_endless_answer_is_not_read(receiver) -> None:
    """200 and then megabytes without end: the callback is delivered at once; the answer's
    body, which nobody needs, was read to its end before (memory without bound, and a try
    that never ended while the receiver kept sending)."""

    async def endless(writer: asyncio.StreamWriter, sent: dict) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % (1 << 20) + b"x" * (1 << 20) + b"\r\n"
        while True:
            writer.write(chunk)
            sent["bytes"] += len(chunk)
            await writer.drain()

    url, sent = await receiver(endless)
    async with httpx.AsyncClient(timeout=10, follow_redirects=False) as client:
        started = time.monotonic()
        outcome = await asyncio.wait_for(callbacks.post(client, url, {"id": "j1"}), 20)
    assert outcome == ("delivered", True)
    assert time.monotonic() - started < 5
    assert sent["bytes"] < 64 << 20, f"{sent['bytes'] >> 20} MiB sent and read"


async def test_a_head_sent_a_byte_at_a_time_ends_the_try_within_its_bound(receiver) -> None:
    """Each byte comes within the read timeout, so a try bounded only per read never ended:
    one such receiver held a slot of the outbox for good. The try now fails after its whole
    bound, to be tried again later."""

    async def trickle(writer: asyncio.StreamWriter, sent: dict) -> None:
        while True:
            writer.write(b"H")
            sent["bytes"] += 1
            await writer.drain()
            await asyncio.sleep(0.2)

    url, _ = await receiver(trickle)
    async with httpx.AsyncClient(timeout=1.0, follow_redirects=False) as client:
        started = time.monotonic()
        outcome, final = await asyncio.wait_for(
            callbacks.post(client, url, {"id": "j2"}, total_s=2.0), 20
        )
    assert not final and "2 s" in outcome, outcome
    assert 1.5 < time.monotonic() - started < 5


async def test_a_redirect_is_refused_not_followed(receiver) -> None:
    """A receiver that redirects (to an address no allowed host names) is not followed, and
    its callback is not tried again and again: it would redirect again."""
    seen = []

    async def elsewhere(writer: asyncio.StreamWriter, sent: dict) -> None:
        seen.append(True)
        writer.write(
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://169.254.169.254/latest\r\n"
            b"Content-Length: 0\r\n\r\n"
        )
        await writer.drain()

    url, _ = await receiver(elsewhere)
    async with httpx.AsyncClient(timeout=5, follow_redirects=False) as client:
        outcome, final = await callbacks.post(client, url, {"id": "j3"})
    assert final and outcome.startswith("refused: HTTP 307"), outcome
    assert seen == [True]
