"""A minimal keep-alive HTTP/1.1 client for closed-loop load on one URL.

httpx costs 1-3 ms of client CPU per request on this class of machine, more
than the proxy hop being measured; this sends pre-built bytes and reads
Content-Length framed answers, which is all the proxy ever returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.retry_after: float | None = None
        """The last answer's `Retry-After`, in seconds (None: it had none)."""

    @classmethod
    async def open(cls, url: str) -> Connection:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        self.retry_after = None
        for line in lines[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
            elif line[:12].lower() == b"retry-after:":
                self.retry_after = float(line[12:])
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):  # the server closed it first
            await self.writer.wait_closed()


def post_bytes(
    url: str,
    body: bytes,
    content_type: str = "application/octet-stream",
    headers: dict[str, str] | None = None,
) -> bytes:
    parts = urlsplit(url)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body
