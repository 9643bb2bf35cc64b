"""The batch's HTTP/1.1 client: keep-alive connections to one origin, one request at a time
on each, answers framed by Content-Length, chunks or the connection's end.

Why not a library: on two cores shared with the mesh, every microsecond of the batch's CPU is
taken from the mesh it measures. aiohttp cost ~210 us a request here, httpx more (its pool
asks every connection whether it expired, a syscall each, on every request); the batch needs
one method on one origin, which asyncio's streams do in ~80 us (bench batch).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
"""Largest status line and headers accepted (the stream's buffer limit)."""


class NoAnswer(Exception):
    """The connection failed or closed before a whole answer came."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Names in lower case; a repeated header keeps its last value."""
    body: bytes
    keep_alive: bool


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.used = False
        """Answered a request before: a failure before its next answer may be the server
        having closed it while idle, and is worth one try on a new connection."""

    async def exchange(self, head: bytes, body: bytes) -> Answer:
        self.writer.writelines((head, body) if body else (head,))
        status, headers = _head(await self.reader.readuntil(b"\r\n\r\n"))
        keep_alive = headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            content = await self._chunks()
        elif "content-length" in headers:
            content = await self.reader.readexactly(int(headers["content-length"]))
        elif status in (204, 304) or 100 <= status < 200:
            content = b""
        else:  # delimited by the connection's end
            content, keep_alive = await self.reader.read(), False
        self.used = True
        return Answer(status, headers, content, keep_alive)

    async def _chunks(self) -> bytes:
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while await self.reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise NoAnswer(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class Client:
    """Requests to the origin of `url` (its path, if any, prefixes every request's), on
    connections kept open between requests and reused, newest first."""

    def __init__(
        self,
        url: str,
        timeout_s: float,
        headers: dict[str, str] | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        common = {"Host": parts.netloc.rpartition("@")[2], **(headers or {})}
        self._common = "".join(f"{k}: {v}\r\n" for k, v in common.items())
        self._idle: list[Connection] = []

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Answer:
        """The answer; NoAnswer when the connection failed first or no answer came within
        `timeout_s` (either leaves nothing behind)."""
        lines = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._common}{length}{lines}\r\n"
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._exchange(head.encode("latin-1"), body)
        except TimeoutError:
            raise NoAnswer(f"no answer within {self.timeout_s:g} s") from None

    async def _exchange(self, head: bytes, body: bytes) -> Answer:
        """On an idle connection, or a new one."""
        while True:
            connection = self._idle.pop() if self._idle else await self._open()
            try:
                answer = await connection.exchange(head, body)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                connection.close()
                if connection.used:  # closed by the server while idle: once more
                    continue
                raise NoAnswer(_reason(exc)) from None
            except BaseException:  # a timeout or a cancellation mid-exchange
                connection.close()
                raise
            if answer.keep_alive:
                self._idle.append(connection)
            else:
                connection.close()
            return answer

    async def _open(self) -> Connection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.tls, limit=MAX_HEAD
                )
        except TimeoutError:
            raise NoAnswer(f"no connection to {self.host}:{self.port} within "
                           f"{self.connect_timeout_s:g} s") from None  # fmt: skip
        except OSError as exc:
            raise NoAnswer(f"cannot connect to {self.host}:{self.port}: {_reason(exc)}") from None
        return Connection(reader, writer)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the connection closed before the whole answer came"
    if isinstance(exc, asyncio.LimitOverrunError):
        return f"an answer's head longer than {MAX_HEAD} bytes"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
