"""ModelStreamInfer, served: one stream, many requests, each run as soon as it arrives and
answered when done, matched by id; a failed one is answered with its error and the stream
goes on. Bounded per stream (requests and bytes running or unsent) and by the service's
byte window shared with unary calls, so that a client that does not read its answers is
held back by gRPC's flow control instead of filling the server's memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from protos import pb, wire
from protos.channels import (
    HTTP_STATUS_PARAMETER,
    STREAM_CANCEL_PARAMETER,
    STREAM_DRAINED_METADATA,
    STREAM_STATUS_PARAMETER,
)
from protos.errors import Overloaded
from protos.mailbox import Mailbox
from v2server.bytewindow import ByteWindow
from v2server.dataplane import DataPlane
from v2server.interceptors import CallScope, InFlight, error_status, request_id_of

STREAM_WINDOW = 128
"""Requests of one stream that may be running or answered but not yet sent; beyond
that the stream is not read, so a client that does not read its answers is held back by
gRPC's flow control instead of filling the server's memory."""

Context = aio.ServicerContext


class Streams:
    """A service's open ModelStreamInfer streams (`serve`, one call each)."""

    def __init__(
        self,
        plane: DataPlane,
        in_flight: InFlight,
        held: ByteWindow,
        window_bytes: int,
        max_message: int,
    ) -> None:
        self.plane = plane
        self._in_flight = in_flight
        self._held = held
        """Bytes of inference requests the service holds, unary and streamed."""
        self._window_bytes = window_bytes
        self._max_message = max_message
        self._open: set[Mailbox[_Answer]] = set()
        """The answer queues of open streams (told when the server drains)."""

    def drain(self) -> None:
        """Every open stream ends once its running requests are answered."""
        for answers in self._open:
            answers.put_nowait(_DRAIN)

    async def serve(
        self, requests: AsyncIterator[wire.ParsedInferRequest], context: Context
    ) -> AsyncIterator[bytes]:
        """Every request of the stream runs as soon as it arrives and is answered when
        done; a failed one is answered with its error_message and the stream goes on."""
        if self.plane.draining:
            # Refused like a unary call (the caller retries elsewhere): a stream that ended at
            # once with status OK and its request unread read as "no streams here" to callers.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        stream_id = request_id_of(context)
        # (answer, bytes held); no answer for a request its sender cancelled.
        answers: Mailbox[_Answer] = Mailbox()
        running: set[asyncio.Task[None]] = set()
        by_id: dict[str, asyncio.Task[None]] = {}
        """The latest running request of each id (for cancellation)."""

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            key = task.get_name()
            if by_id.get(key) is task:
                del by_id[key]
            if self.plane.draining:
                answers.put_nowait(_DRAIN)  # wakes the writer to see whether it may end

        window = ByteWindow(STREAM_WINDOW)  # of messages: one "byte" each
        stream_bytes = ByteWindow(self._window_bytes)

        async def one(request: wire.ParsedInferRequest) -> None:
            request_id = request.id or stream_id
            with CallScope(
                self._in_flight, "ModelStreamInfer", request, request_id, context
            ) as call:
                try:
                    body = await self.plane.infer(request, context.time_remaining())
                    if len(body) > self._max_message:
                        # gRPC would fail the whole stream: only this request fails.
                        raise Overloaded(
                            f"Sent message larger than max ({len(body)} vs. {self._max_message})"
                        )
                    answers.put_nowait((wire.stream_response(body), request.size))
                except asyncio.CancelledError:
                    call.code = grpc.StatusCode.CANCELLED
                    answers.put_nowait((None, request.size))
                    raise
                except Exception as exc:
                    call.code, text = error_status(exc, "ModelStreamInfer")
                    http = getattr(exc, "http_status", None)
                    error = _stream_error(request.message, text, call.code, http)
                    answers.put_nowait((error, request.size))
                finally:
                    request.release()

        waiting = 0
        """Requests read but not running yet (waiting for room): a draining stream must
        not end under them."""

        async def read() -> None:
            nonlocal waiting
            try:
                async for request in requests:
                    if _is_cancel(request):
                        if (task := by_id.get(request.id)) is not None:
                            task.cancel()
                        continue
                    # Not read on until there is room, in messages and in bytes: a sender
                    # that does not read its answers is held back by flow control.
                    waiting += 1
                    try:
                        await window.wait_take(1)
                        await stream_bytes.wait_take(request.size)
                        await self._held.wait_take(request.size)
                    finally:
                        waiting -= 1
                    task = asyncio.create_task(one(request), name=request.id)
                    running.add(task)
                    by_id[request.id] = task
                    task.add_done_callback(done)
                    # Not held while the stream waits for its next request: an OCR page is
                    # up to 20 MiB, and every idle stream kept its last one.
                    request = task = None  # type: ignore[assignment]
                while running:
                    await asyncio.wait(set(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        self._open.add(answers)
        draining = False  # a stream opened while the server drains was refused above
        try:
            while True:
                if draining and not running and not waiting and not answers:
                    # Ends the call: the caller opens a new stream elsewhere.
                    context.set_trailing_metadata(((STREAM_DRAINED_METADATA, "1"),))
                    return
                item = await answers.get()
                if item is None:
                    break
                if item is _DRAIN:
                    draining = True
                    continue
                answer, size = item
                if answer is not None:
                    yield wire.Handed(answer)
                window.give(1)
                stream_bytes.give(size)
                self._held.give(size)
                item = answer = None  # nor its last answer (see read)
            await reader  # the caller's half-close or a broken stream surfaces here
        finally:
            self._open.discard(answers)
            reader.cancel()
            for task in list(running):
                task.cancel()
            self._held.give(stream_bytes.used)  # what unsent answers still held


_Answer = tuple[bytes | None, int] | None
"""(answer, bytes held), or None once the stream's reader is done."""

_DRAIN = (None, -1)
"""Put in every open stream's answer queue when the server drains: each stream ends once
its running requests are answered, so that a graceful stop does not wait for idle streams
until its grace runs out."""


def _stream_error(
    request: pb.ModelInferRequest, text: str, code: grpc.StatusCode, http: int | None
) -> bytes:
    about = pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    about.parameters[STREAM_STATUS_PARAMETER].int64_param = code.value[0]
    if http is not None:
        about.parameters[HTTP_STATUS_PARAMETER].int64_param = http
    return pb.ModelStreamInferResponse(error_message=text, infer_response=about).SerializeToString()


def _is_cancel(request: wire.ParsedInferRequest) -> bool:
    param = request.message.parameters.get(STREAM_CANCEL_PARAMETER)
    return param is not None and param.bool_param
