"""The batch's HTTP/1.1 client against small servers that answer as real ones may: chunked,
close-delimited, dropping an idle kept-alive connection, closing without an answer, never
answering."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from batch import http1

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]
"""Answers the n-th request of the server (the head already read); False closes it."""


class Server:
    def __init__(self, answer: Handler) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
                if length:
                    await reader.readexactly(int(length[0].split(b":")[1]))
                if not await self.answer(reader, writer, len(self.heads)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Server, str]]]]:
    started: list[asyncio.Server] = []

    async def start(answer: Handler) -> tuple[Server, str]:
        server = Server(answer)
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        started.append(listening)
        return server, f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"

    yield start
    for listening in started:
        listening.close()


def writes(*raw: bytes, keep: bool = True) -> Handler:
    """A handler answering its n-th request with raw[n-1]."""

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(raw[min(n, len(raw)) - 1])
        await writer.drain()
        return keep

    return answer


async def test_answers_framed_every_way_on_one_kept_connection(serve) -> None:
    server, url = await serve(
        writes(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n",
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\ncontent-length: 4\r\n\r\nbusy",
        )
    )
    client = http1.Client(url + "/mesh/", timeout_s=5, headers={"Authorization": "Bearer k"})
    first = await client.request("POST", "/v1/x", b"abc", {"X-Request-Id": "r1"})
    second = await client.request("GET", "/v1/y")
    third = await client.request("POST", "/v1/z", b"")
    client.close()
    assert (first.status, first.body) == (200, b"hello")
    assert (second.status, second.body) == (200, b"hello world")
    assert (third.status, third.headers["retry-after"], third.body) == (503, "2", b"busy")
    assert server.connections == 1
    assert server.heads[0].startswith(b"POST /mesh/v1/x HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Authorization: Bearer k\r\n" in server.heads[0]
    assert (
        b"Content-Length: 3\r\n" in server.heads[0] and b"X-Request-Id: r1\r\n" in server.heads[0]
    )
    assert b"Content-Length" not in server.heads[1]


async def test_an_answer_to_the_connections_end_closes_it(serve) -> None:
    server, url = await serve(
        writes(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", keep=False)
    )
    client = http1.Client(url, timeout_s=5)
    for _ in range(2):
        answer = await client.request("GET", "/")
        assert (answer.body, answer.keep_alive) == (b"all of it", False)
    assert server.connections == 2


async def test_a_kept_connection_the_server_dropped_is_tried_once_on_a_new_one(serve) -> None:
    """uvicorn closes a connection idle for 5 s: the next request on it gets no answer, and
    goes again at once on a new connection rather than failing (and waiting a back-off)."""
    server, url = await serve(writes(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", keep=False))
    client = http1.Client(url, timeout_s=5)
    assert (await client.request("GET", "/")).body == b"ok"  # kept: the answer did not say close
    await asyncio.sleep(0.05)
    assert (await client.request("GET", "/")).body == b"ok"
    client.close()
    assert server.connections == 2


async def test_a_new_connection_closed_without_an_answer_is_no_answer(serve) -> None:
    async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        return False

    server, url = await serve(hang_up)
    client = http1.Client(url, timeout_s=5)
    with pytest.raises(http1.NoAnswer, match="closed before the whole answer"):
        await client.request("POST", "/", b"x")
    assert server.connections == 1  # not tried again: it may have been the request's fault


async def test_a_server_that_never_answers_times_out_and_its_connection_is_dropped(serve) -> None:
    async def silent(reader: asyncio.StreamReader, _: asyncio.StreamWriter, n: int) -> bool:
        await reader.read()
        return False

    _, url = await serve(silent)
    client = http1.Client(url, timeout_s=0.2)
    with pytest.raises(http1.NoAnswer, match=r"^no answer within 0\.2 s$"):
        await client.request("GET", "/")
    assert not client._idle


async def test_no_server_and_no_url_are_named() -> None:
    with pytest.raises(http1.NoAnswer, match=r"cannot connect to 127\.0\.0\.1:1"):
        await http1.Client("http://127.0.0.1:1", timeout_s=5).request("GET", "/")
    with pytest.raises(ValueError, match="http:// or https://"):
        http1.Client("127.0.0.1:8080", timeout_s=5)
