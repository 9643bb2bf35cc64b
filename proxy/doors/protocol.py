"""uvicorn's httptools protocol with limits on what a request's head may cost, and a hook
that tells a request's handler at once when its client hangs up.

httptools accepts a head of any size and any number of header lines, and takes longer
than linearly to parse a huge one (a 128 MB header: 21 s of the event loop, measured);
uvicorn gives a client unlimited time to finish sending it. Here a head larger than
`max_head_bytes`, with more than `max_headers` lines, or not complete within
`head_timeout_s` of its first byte is refused before the application sees it: 431 or
408, `Connection: close`. A body's own limits (size, rate, the request's budget) are the
application's: `proxy.doors.uploads`.

The hook (`HANG_UP` in the scope's extensions: register a callback, get its removal) lets a
request's work be cancelled when its connection is lost without a task per request reading
`http.disconnect` (proxy/doors/disconnect.py).

An answer's head and body leave in one write (`_Coalesced`): uvicorn writes the head as the
app starts its answer and the body next, two system calls and two TCP segments (the socket
has no Nagle delay), each waking the reader, nginx's front or the client, once more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from protos.logs import new_id

STATUS_TEXT = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
HANG_UP = "mesh.hang_up"
"""The scope's extension: `watch(callback) -> unwatch`, the callback run once if the
connection is lost (the client hung up) while it is registered, at once if it already is."""


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a head that broke a limit."""


class _Coalesced:
    """What an answer is written to: a write is held until the next one, which takes it along,
    or until the event loop's turn ends. An app sends its answer's start and its body in one
    turn, so they leave together; a streamed answer's head leaves when its turn ends."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._held = None
            self._transport.writelines((held, data))

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    max_head_bytes = 32 * 1024
    max_headers = 100
    head_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._head_bytes = 0
        self._parsed_bytes = 0
        self._header_count = 0
        self._heads_done = 0
        self._head_started = 0.0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None
        self._hang_ups: list[Callable[[], None]] = []
        self._coalesced: _Coalesced | None = None

    @classmethod
    def configured(
        cls, max_head_bytes: int, max_headers: int, head_timeout_s: float
    ) -> type[GuardedHttpToolsProtocol]:
        """A subclass with these limits (uvicorn takes a protocol class, not an instance)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "max_head_bytes": max_head_bytes,
                "max_headers": max_headers,
                "head_timeout_s": head_timeout_s,
            },
        )

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # refused: the connection is closing
            return
        head_open, heads_done = self._in_head, self._heads_done
        try:
            super().data_received(data)
        finally:
            if self._refusal is not None:
                self._refuse(*self._refusal)
            elif self._in_head:
                if self._head_timer is None:
                    # Armed only for a head that spans chunks: most arrive whole, and a
                    # timer armed and cancelled for every request cost ~4 us of it.
                    self._head_timer = self.loop.call_at(
                        self._head_started + self.head_timeout_s, self._head_too_slow
                    )
                if head_open and self._heads_done == heads_done:
                    # A head was open before this chunk and still is after it: all of it
                    # was head. (A head that began inside the chunk is counted from the
                    # next one, and by the parser's callbacks meanwhile.)
                    self._head_bytes += len(data)
                    if self._head_bytes > self.max_head_bytes:
                        self._refuse(431, f"request head over {self.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._parsed_bytes = 0
        self._header_count = 0
        self._head_started = self.loop.time()
        super().on_message_begin()

    def send_400_response(self, msg: str) -> None:
        # A limit stops the parser from a callback, which httptools reports as a parse
        # error: answer with the limit's status instead of uvicorn's plain 400.
        if self._refusal is not None:
            self._refuse(*self._refusal)
        else:
            super().send_400_response(msg)

    def on_url(self, url: bytes) -> None:
        self._parsed_bytes += len(url)
        if self._parsed_bytes > self.max_head_bytes:
            self._refusal = (431, f"request head over {self.max_head_bytes} bytes")
            raise _Refused
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._parsed_bytes += len(name) + len(value) + 4
        if self._header_count > self.max_headers:
            self._refusal = (431, f"more than {self.max_headers} header lines")
            raise _Refused
        if self._parsed_bytes > self.max_head_bytes:
            self._refusal = (431, f"request head over {self.max_head_bytes} bytes")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        self._cancel_head_timer()
        self.scope.setdefault("extensions", {})[HANG_UP] = self._watch  # type: ignore[typeddict-item]
        super().on_headers_complete()
        if self._coalesced is None:
            self._coalesced = _Coalesced(self.transport, self.loop)
        self.cycle.transport = self._coalesced  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)
        hang_ups, self._hang_ups = self._hang_ups, []
        for hung_up in hang_ups:
            hung_up()

    def _watch(self, hung_up: Callable[[], None]) -> Callable[[], None]:
        if self.parser is None:  # lost already (or refused): at once
            hung_up()
        elif self.flow is not None and self.cycle is not None and not self.cycle.more_body:
            # uvicorn stops reading a connection whose body overran its buffer (64 KiB) until
            # the app asks for more: a body read whole, the connection is read again, so that
            # the client's hang-up (end of stream) is seen. A `receive()` did this before.
            self.flow.resume_reading()
        self._hang_ups.append(hung_up)
        return lambda: self._hang_ups.remove(hung_up) if hung_up in self._hang_ups else None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The keep-alive timer covers the wait for the next request's first byte.
        self._cancel_head_timer()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(408, f"request head not complete within {self.head_timeout_s:g} s")

    def _refuse(self, status: int, message: str) -> None:
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        body = orjson.dumps({"error": message, "id": new_id()})
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, STATUS_TEXT[status], len(body)) + body
        )
        self.transport.close()
        self.parser = None  # type: ignore[assignment]
