"""The gRPC door's unary ModelInfer behind a native HTTP/2 front (PROXY_GRPC_FRONT).

grpc.aio's server spends ~0.4 ms of CPU on a unary call before its handler runs, 2.4x what
uvicorn spends on the same bytes over HTTP/1.1 (bench/README, issue 30), and at concurrency
32 it held two thirds of a request's time. So nginx, in C, terminates the callers' HTTP/2 and
hands each ModelInfer to this route as an HTTP/1.1 POST on a kept-alive connection: the gRPC
message as it came (5-byte prefix and protobuf), the call's metadata as headers. The answer's
status goes back as headers that nginx sends as the call's trailers (its configuration:
proxy/doors/grpc_front_nginx.py). Every other method nginx passes to the grpc.aio door.

The call runs exactly as on the door: the same servicer (byte window, data plane), the same
scope (request id, metrics, spans, in-flight count for the graceful stop), the same error
table, the client's `grpc-timeout` as its deadline, a hang-up (nginx closes the upstream
connection when its caller resets the stream) as a cancellation."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

import grpc
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from protos import wire
from protos.channels import METHOD_PREFIX
from protos.eager import Pending, eager
from proxy.doors import inflate
from proxy.doors.disconnect import until_disconnect
from proxy.doors.middleware import key_matches
from proxy.engine.admission import Admission
from proxy.engine.ledger import Ledger
from proxy.errors import ClientGone, Problem, grpc_code
from v2server.interceptors import REQUEST_ID_KEY, CallScope, error_status, error_trailers
from v2server.server import V2Server

PATH = METHOD_PREFIX + "ModelInfer"
"""The only method the front hands over HTTP/1.1; nginx routes the rest to the door."""
FRONT_HEADER = b"x-mesh-grpc-front"
"""Set by the front's nginx on what it hands here: without it, a POST to PATH is plain HTTP,
answered by the REST door (404)."""
REQUEST_ID_HEADER = REQUEST_ID_KEY.encode()
STATUS_ONLY = 599
"""HTTP status of the route's answers that are a gRPC status alone (an error): nginx answers
them as a Trailers-Only response of their headers (grpc_front_nginx.py, @status_only)."""
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
"""grpc-message is percent-encoded: everything but printable ASCII and '%' (gRPC's spec)."""


def grpc_timeout(value: str) -> float | None:
    """Seconds of a `grpc-timeout` header (`<digits><unit>`); None when absent or bad."""
    if len(value) < 2 or value[-1] not in _UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * _UNITS[value[-1]]


class _Call:
    """What the servicer and the call's scope read of a grpc.aio context: the deadline and
    the metadata (x-request-id, traceparent)."""

    def __init__(self, headers: list[tuple[bytes, bytes]], timeout: float | None) -> None:
        self._headers = headers
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self) -> list[tuple[str, str]]:
        """Decoded when asked (a span's `traceparent`): the request id is read before."""
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._headers]


class GrpcFront:
    """ASGI middleware: answers the front's ModelInfer before everything else (its errors
    are gRPC statuses, not REST's JSON); anything else goes on to `app`."""

    def __init__(
        self,
        app: ASGIApp,
        door: V2Server,
        admission: Admission,
        api_key: str | None = None,
        max_wait_s: float = 60.0,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.app = app
        self.door = door
        self.admission = admission
        """Whose bytes in flight a message counts in while it arrives and is answered."""
        self.api_key = (api_key or "").encode()
        self.max_wait_s = max_wait_s
        """Longest a message may take to arrive when the call has no deadline."""
        self.max_message_bytes = max_message_bytes
        """Largest message once decompressed (the door's own limit: grpc_door.py)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        raw = dict(scope["headers"])
        if FRONT_HEADER not in raw or scope["method"] != "POST":
            await self.app(scope, receive, send)  # not the front's: REST's 404 or 405
            return
        call = _Call(
            scope["headers"], grpc_timeout(raw.get(b"grpc-timeout", b"").decode("latin-1"))
        )
        if self.api_key and not key_matches(
            self.api_key, raw.get(b"x-api-key", b""), raw.get(b"authorization", b"")
        ):
            await _answer(send, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong API key")
            return
        with self.admission.ledger() as ledger:
            await self._call(scope, receive, send, raw, call, ledger)

    async def _call(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        raw: dict[bytes, bytes],
        call: _Call,
        ledger: Ledger,
    ) -> None:
        try:
            # A message trickled in is bounded as REST's uploads are: by the call's budget,
            # and its bytes by the proxy's in flight (Ledger.hold_upload), as they arrive.
            # One that came with its head is taken without a timer (protos/eager.py).
            body = eager(_body(receive, ledger))
            if isinstance(body, Pending):
                remaining = call.time_remaining()
                async with asyncio.timeout(self.max_wait_s if remaining is None else remaining):
                    body = await body
        except TimeoutError:
            await _answer(send, grpc.StatusCode.DEADLINE_EXCEEDED, "the message came too slowly")
            return
        except ClientGone:
            return
        except Problem as exc:  # the proxy at capacity: UNAVAILABLE, as REST's 503
            await _answer(send, grpc_code(exc.status), exc.message, error_trailers(exc))
            return
        try:
            parsed = await _message(body, raw.get(b"grpc-encoding"), self.max_message_bytes)
            if isinstance(parsed, wire.ParsedInferRequest) and parsed.size > len(body):
                ledger.hold_upload(parsed.size - len(body))  # what decompressing added
        except Problem as exc:
            await _answer(send, grpc_code(exc.status), exc.message, error_trailers(exc))
            return
        request = Request(scope, receive)
        request_id = raw.get(REQUEST_ID_HEADER, b"").decode("latin-1")
        with CallScope(
            self.door.in_flight,
            "ModelInfer",
            parsed,
            request_id,
            call,  # type: ignore[arg-type]
        ) as scope_:
            try:
                if isinstance(parsed, _Refused):
                    raise parsed
                answer = await until_disconnect(
                    request,
                    self.door.servicer.ModelInfer(parsed, call),  # type: ignore[arg-type]
                )
            except ClientGone:
                scope_.code = grpc.StatusCode.CANCELLED
                return
            except asyncio.CancelledError:
                scope_.code = grpc.StatusCode.CANCELLED
                raise
            except _Refused as exc:
                scope_.code = exc.code
                await _answer(send, exc.code, exc.text)
                return
            except Exception as exc:
                scope_.code, text = error_status(exc, "ModelInfer")
                await _answer(send, scope_.code, text, error_trailers(exc))
                return
        await _answer(send, grpc.StatusCode.OK, "", (), answer)


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, text: str) -> None:
        self.code, self.text = code, text


async def _body(receive: Receive, ledger: Ledger) -> bytes:
    """The call's whole message, as it arrives (not Starlette's Request.body: its stream's
    generator costs more than the read), each piece on `ledger`; ClientGone when the caller
    left first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        ledger.hold_upload(len(chunk))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _message(
    body: bytes, encoding: bytes | None, limit: int
) -> wire.ParsedInferRequest | _Refused:
    """The one message of a unary call, decompressed as its `grpc-encoding` says, or why
    there is none."""
    if len(body) < 5:
        return _Refused(grpc.StatusCode.INVALID_ARGUMENT, "no gRPC message in the call")
    if int.from_bytes(body[1:5], "big") != len(body) - 5:
        return _Refused(
            grpc.StatusCode.INVALID_ARGUMENT, "a unary call carries exactly one message"
        )
    if body[0] == 0:
        return wire.parse_infer_request(body[5:])
    if body[0] != 1:
        return _Refused(grpc.StatusCode.INVALID_ARGUMENT, "the message's flag is not 0 or 1")
    name = (encoding or b"").decode("latin-1")
    if not name or name == "identity":
        return _Refused(
            grpc.StatusCode.INVALID_ARGUMENT, "a compressed message without its grpc-encoding"
        )
    if not inflate.taken(name):
        return _Refused(
            grpc.StatusCode.UNIMPLEMENTED,
            f"message encoding '{name}' is not supported (gzip, deflate, identity)",
        )
    try:
        return wire.parse_infer_request(await inflate.inflated(memoryview(body)[5:], name, limit))
    except Problem as exc:
        return _Refused(grpc_code(exc.status), exc.message)


async def _answer(
    send: Send,
    code: grpc.StatusCode,
    text: str,
    trailers: tuple[tuple[str, str], ...] = (),
    message: bytes | None = None,
) -> None:
    """The call's answer to nginx: its message (nginx adds the trailer `grpc-status: 0`), or
    its status alone as STATUS_ONLY's headers."""
    if message is not None:
        body = b"\x00" + len(message).to_bytes(4, "big") + message
        headers = [(b"content-type", b"application/grpc")]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    headers = [(b"grpc-status", str(code.value[0]).encode()), (b"content-length", b"0")]
    if text:
        headers.append((b"grpc-message", quote(text, safe=_SAFE).encode()))
    headers.extend((key.encode(), value.encode()) for key, value in trailers)
    await send({"type": "http.response.start", "status": STATUS_ONLY, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
