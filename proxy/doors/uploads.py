"""Request bodies read within limits: size (while reading, on every path), time (the
request's budget covers the upload) and rate (a client trickling bytes is cut off).

Before, a chunked multipart upload was spooled whole (1 GB in memory plus 1 GB on disk)
before its 413, a v2 JSON body read whole before its size was checked, and a client
sending a byte a second held its in-flight slot for as long as it liked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.types import Message

from protos.eager import Pending, eager
from proxy.doors import inflate
from proxy.engine.ledger import Ledger
from proxy.errors import ClientGone, Problem


@dataclass(frozen=True)
class UploadLimits:
    max_bytes: int
    """Largest body; more is a 413 as soon as it arrives."""
    min_rate_bps: float = 32 * 1024
    """Slowest upload accepted once `grace_s` has passed (bytes per second)."""
    grace_s: float = 2.0


async def read_body(
    request: Request, limits: UploadLimits, deadline: float, ledger: Ledger | None = None
) -> bytes:
    """The whole body, or Problem 413 (too large) / 408 (too slow, or past `deadline`,
    loop time). A Content-Length over the limit is refused before a byte is read; every
    byte received goes on `ledger` as it arrives."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limits.max_bytes:
        raise Problem(
            413, f"body of {length} bytes exceeds the limit of {limits.max_bytes}", close=True
        )
    loop = asyncio.get_running_loop()
    started = loop.time()
    receive = request.receive
    chunks: list[bytes] = []
    size = 0

    def took(message: Message) -> bool:
        """The message's bytes kept and bounded; True when they end the body."""
        nonlocal size
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limits.max_bytes:
                raise Problem(
                    413, f"body exceeds the limit of {limits.max_bytes} bytes", close=True
                )
            if ledger is not None:
                ledger.hold_upload(len(chunk))
            chunks.append(chunk)
        return not message.get("more_body", False)

    def due() -> float:
        """When the next chunk must have come: the budget's end, or the rate floor for the
        bytes received so far."""
        return min(deadline, started + limits.grace_s + size / limits.min_rate_bps)

    # A body that came with its head is taken without a timer (protos/eager.py: ~5.5 us a
    # request on uvloop); one that must be waited for, with one timer for the whole read,
    # moved on as bytes arrive (a timer per chunk, and one more for the end of the stream,
    # cost a small body ~25 us of its ~30 us read).
    step: Message | Pending | None = eager(receive())
    if not isinstance(step, Pending):
        if took(step):  # type: ignore[arg-type]
            return await _decoded(request, b"".join(chunks), limits, ledger)
        step = None
    try:
        async with asyncio.timeout_at(due()) as timer:
            while True:
                message = await (receive() if step is None else step)
                step = None
                if took(message):
                    break
                timer.reschedule(due())
    except TimeoutError:
        if loop.time() >= deadline - 0.001:
            raise Problem(
                408, "the request's time budget ran out while its body was arriving", close=True
            ) from None
        raise Problem(
            408, f"body arriving slower than {limits.min_rate_bps / 1024:g} KiB/s", close=True
        ) from None
    return await _decoded(request, b"".join(chunks), limits, ledger)


async def _decoded(
    request: Request, body: bytes, limits: UploadLimits, ledger: Ledger | None
) -> bytes:
    """The body as it was before its Content-Encoding (gzip, deflate: tritonclient's
    `request_compression_algorithm`), within the same limit; its inflated bytes go on
    `ledger` too."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if not inflate.taken(encoding):
        raise Problem(
            415, f"Content-Encoding '{encoding}' is not supported: send gzip, deflate or identity"
        )
    data = await inflate.inflated(body, encoding, limits.max_bytes)
    if ledger is not None:
        ledger.hold_upload(len(data))
    return data


async def read_image(
    request: Request, limits: UploadLimits, deadline: float, ledger: Ledger | None = None
) -> bytes:
    """The uploaded image: a raw image/* or octet-stream body, or multipart field `file`."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    multipart = content_type.startswith("multipart/form-data")
    if not (
        multipart
        or content_type.startswith("image/")
        or content_type in ("application/octet-stream", "")
    ):
        raise Problem(
            415,
            f"unsupported Content-Type '{content_type}': send the image as "
            "image/*, application/octet-stream or multipart field 'file'",
        )
    body = await read_body(request, limits, deadline, ledger)
    data = await _multipart_file(request, body, limits.max_bytes) if multipart else body
    if not data:
        raise Problem(400, "empty body: send an image")
    return data


async def _multipart_file(request: Request, body: bytes, max_bytes: int) -> bytes:
    """Field `file` of a multipart body already read (and bounded) in full."""

    async def once() -> AsyncIterator[bytes]:
        yield body

    parser = MultiPartParser(
        request.headers, once(), max_files=1, max_fields=10, max_part_size=max_bytes
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise Problem(400, f"unreadable multipart body: {exc.message}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise Problem(422, "multipart body has no file field named 'file'")
        return await upload.read()
    finally:
        await form.close()
