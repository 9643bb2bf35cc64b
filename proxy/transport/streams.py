"""Long-lived ModelStreamInfer streams from the proxy to a service, requests multiplexed
by id: a unary call costs grpc.aio a call set-up and tear-down on both ends of every hop,
a message on an open stream does not.

Each request carries its own deadline (Triton's `timeout` parameter, which the service
honours); each answer its own status (our services put the code beside `error_message`,
v2server/servicer.py; another server's error counts as UNKNOWN). A stream that breaks fails
only the requests in flight on it, with the stream's status (UNAVAILABLE when the service
died), and the next request opens a new one. A request whose caller leaves is cancelled
on the service too when the service says it can (`stream_cancellation` in ServerMetadata)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import grpc
from grpc import aio

from protos import pb, wire
from protos.channels import METHOD_PREFIX, STREAM_CANCEL_PARAMETER, STREAM_DRAINED_METADATA
from protos.mailbox import Mailbox
from proxy.transport.failures import CallFailed, Expired, expire
from proxy.transport.stream_answers import parse_stream_response

UNPROVEN_LIMIT = 3
"""Streams to an address ended while written to, before any answered, that make it unary."""


def _as_is(data: bytes) -> bytes:
    return data


@dataclass(eq=False)
class _Outgoing:
    data: bytes
    sent: bool = False
    dropped: bool = False
    """Its caller left before it was written: never written."""


class MuxStream:
    """One open ModelStreamInfer call; answers matched to their requests by id.

    One task writes every message (in order): a request's own timeout or cancellation
    never lands inside grpc.aio's `write()`, which would cancel the whole call and fail every
    other request on the stream. A request that leaves before its turn to be written is
    dropped from the queue; one that leaves after is cancelled on the service (when it
    listens)."""

    def __init__(self, channel: aio.Channel, pool: StreamPool) -> None:
        method = channel.stream_stream(
            METHOD_PREFIX + "ModelStreamInfer",
            request_serializer=_as_is,
            response_deserializer=parse_stream_response,
        )
        self._call = method(metadata=pool.metadata)
        self._pool = pool
        self._pending: dict[str, asyncio.Future[wire.ParsedInferResponse]] = {}
        self._outbox: Mailbox[_Outgoing] = Mailbox()
        self.closed = False
        self._failure: CallFailed | None = None
        self._reader = asyncio.create_task(self._read())
        self._writer = asyncio.create_task(self._write())

    @property
    def load(self) -> int:
        return len(self._pending)

    async def infer(self, key: str, request: bytes, timeout: float) -> wire.ParsedInferResponse:
        """Send one request (its id is `key`) and wait for its answer, `timeout` seconds at
        most, its turn to be written included (a full window holds the writes back)."""
        if self.closed:
            raise self._failure or CallFailed(
                grpc.StatusCode.UNAVAILABLE, "stream closed", stream=True
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[wire.ParsedInferResponse] = loop.create_future()
        self._pending[key] = future
        outgoing = _Outgoing(request)
        self._outbox.put_nowait(outgoing)
        expiry = loop.call_later(timeout, expire, future)
        try:
            return await future
        except Expired:
            self._leave(key, outgoing)
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except asyncio.CancelledError:
            self._leave(key, outgoing)
            raise
        finally:
            expiry.cancel()
            self._pending.pop(key, None)
            if future.done() and not future.cancelled():
                future.exception()  # seen: a broken stream may fail it after its caller left
            else:
                future.cancel()

    def _leave(self, key: str, outgoing: _Outgoing) -> None:
        """Nobody waits for `key` any more: not written, or cancelled on the service (when
        it listens)."""
        if not outgoing.sent:
            outgoing.dropped = True
        elif not self.closed:
            task = asyncio.ensure_future(self._cancel(key))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # best effort

    async def _cancel(self, key: str) -> None:
        # A pool's first requests may leave before its service's metadata has answered:
        # their cancellation waits for it (it used to be dropped).
        await asyncio.wait_for(self._pool.learned.wait(), 5.0)
        if self._pool.cancels and not self.closed:
            message = pb.ModelInferRequest(id=key)
            message.parameters[STREAM_CANCEL_PARAMETER].bool_param = True
            self._outbox.put_nowait(_Outgoing(message.SerializeToString()))

    async def _write(self) -> None:
        """The stream's only writer: its own task, which no caller's cancellation reaches."""
        try:
            while True:
                outgoing = await self._outbox.get()
                if not outgoing.dropped:
                    outgoing.sent = True
                    await self._call.write(outgoing.data)
                # Not held while the stream idles: an OCR page's request is up to 20 MiB, and
                # every idle stream kept its last one (~140 MiB a proxy after a crowd).
                outgoing = None
        except aio.AioRpcError as exc:
            self._end(self._broken(exc.code(), exc.details()))
        except (asyncio.InvalidStateError, aio.UsageError):
            # The call is over (a server without streams answered UNIMPLEMENTED at once): its
            # status, not the failed write, says why, and decides whether to go unary.
            self._end(self._broken(await self._call.code(), await self._call.details()))

    async def _read(self) -> None:
        failure = CallFailed(grpc.StatusCode.UNAVAILABLE, "stream ended", stream=True)
        answered = 0
        try:
            while True:
                answer = future = None  # an idle stream holds no answer (see _write)
                answer = await self._call.read()
                if answer is aio.EOF:
                    trailers = await self._call.trailing_metadata() or ()
                    drained = any(key == STREAM_DRAINED_METADATA for key, _ in trailers)
                    failure = self._ended_early(answered, drained) or failure
                    break
                if not answer.id:
                    # We never send an empty id: the server does not answer v2 stream
                    # messages by id (MLServer sends ModelInferResponse messages on it).
                    failure = self._unfit(f"an answer without the request's id ({answer})")
                    break
                answered += 1
                self._pool.proven = True
                future = self._pending.pop(answer.id, None)
                if future is None or future.done():
                    continue  # its caller left
                if answer.failure is not None:
                    future.set_exception(answer.failure)
                else:
                    future.set_result(answer.response)  # type: ignore[arg-type]
        except aio.AioRpcError as exc:
            failure = self._broken(exc.code(), exc.details())
        finally:
            self._end(failure)
            self._writer.cancel()  # the call is over: nothing more can be written
            self._call.cancel()

    def _ended_early(self, answered: int, drained: bool) -> CallFailed | None:
        """The server ended the stream (status OK): fine once nothing is outstanding. A
        draining server of ours says so (`drained`), as may one that answered many: requests
        still outstanding crossed its end on the wire and are sent again unary (which a
        server still draining refuses at once). Otherwise a sign that its streams do not
        carry many requests: it ended with requests outstanding after at most one answer, or
        after one answer twice running."""
        if self._pending and (drained or answered > 1):
            return CallFailed(
                grpc.StatusCode.UNAVAILABLE,
                f"stream ended by the server with {len(self._pending)} requests unanswered",
                stream=True,
                resend=True,
            )
        if drained:
            return None
        if self._pending:
            return self._unfit(f"the server ended it with {len(self._pending)} requests unanswered")
        if answered <= 1:
            self._pool.short_lived += 1
            if self._pool.short_lived >= 2:
                return self._unfit("the server ended two streams after one answer each")
        else:
            self._pool.short_lived = 0
        return None

    def _broken(self, code: grpc.StatusCode, details: str | None) -> CallFailed:
        """The stream's own failure, for the requests on it (counted once per stream)."""
        failure = _broken(code, details)
        if code != grpc.StatusCode.INTERNAL or self._pool.proven or self._failure is not None:
            return failure
        # A server without ModelStreamInfer answers UNIMPLEMENTED at once; a write racing
        # that answer fails INTERNAL and grpc.aio reports that instead (KServe's server did
        # so for ~45% of first requests). Thrice in a row before any answer: no streams.
        self._pool.unproven += 1
        if self._pool.unproven >= UNPROVEN_LIMIT:
            return self._unfit(f"{self._pool.unproven} streams ended before any answer")
        failure.resend = True
        return failure

    def _unfit(self, why: str) -> CallFailed:
        self._pool.unfit = why
        return CallFailed(
            grpc.StatusCode.UNAVAILABLE, f"stream unfit: {why}", stream=True, unfit=True
        )

    def _end(self, failure: CallFailed) -> None:
        """The stream failed: every request on it fails with `failure`, the next ones go to
        another stream."""
        self.closed = True
        self._failure = self._failure or failure
        for future in self._pending.values():
            if not future.done():
                future.set_exception(failure)
        self._pending.clear()

    async def close(self) -> None:
        self.closed = True
        self._call.cancel()
        self._reader.cancel()
        self._writer.cancel()
        await asyncio.gather(self._reader, self._writer, return_exceptions=True)


def _broken(code: grpc.StatusCode, details: str | None) -> CallFailed:
    """A stream's own failure (its call's status), for the requests on it. A stream the
    service ended while a request was being written fails the write with INTERNAL ("Internal
    error from Core"): like a dead service, that is UNAVAILABLE, retried elsewhere or later."""
    details = details or code.name
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED):
        return CallFailed(grpc.StatusCode.UNAVAILABLE, f"stream broken ({details})", stream=True)
    return CallFailed(code, details, stream=True)


class StreamPool:
    """Up to `size` streams to one address; each request goes to the least busy one."""

    def __init__(
        self, channel: aio.Channel, size: int, metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self._channel = channel
        self._size = size
        self.metadata = metadata  # sent as each stream opens: `mesh batch`'s API key
        self.cancels = False
        """The service cancels a request on our word (set once its metadata says so)."""
        self.traces = False  # it reads a request's `traceparent` (protos/tracing.py)
        self.learned = asyncio.Event()
        """Set once `cancels` is known (the metadata answered, or failed to)."""
        self._streams: list[MuxStream] = []
        self._ids = itertools.count()
        self.unfit = ""
        """Why this address's streams do not carry many requests (set once learnt)."""
        self.short_lived = 0
        """Streams in a row the server ended after at most one answer."""
        self.proven = False
        """A stream to this address has answered a request."""
        self.unproven = 0
        """Streams ended while written to before any stream had answered (MuxStream._broken)."""

    def key(self, request_id: str) -> str:
        """A request id unique on this pool's streams, that still names the request."""
        return f"{request_id}.{next(self._ids)}"

    def pick(self) -> MuxStream:
        streams = self._streams
        if any(s.closed for s in streams):
            streams = self._streams = [s for s in streams if not s.closed]
        if len(streams) < self._size:
            stream = MuxStream(self._channel, self)
            streams.append(stream)
            return stream
        if len(streams) == 2:  # the default: no key function, no lambda
            first, second = streams
            return first if first.load <= second.load else second
        return min(streams, key=lambda s: s.load)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._streams))
        self._streams.clear()
