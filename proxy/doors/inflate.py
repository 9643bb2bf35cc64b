"""Compressed bodies and messages inflated within the door's limit, for every door: REST's
`Content-Encoding` (tritonclient's `request_compression_algorithm`) and gRPC's
`grpc-encoding` (its `compression_algorithm`, perf_analyzer's --grpc-compression-algorithm).

A few KiB of gzip may inflate to gigabytes: never more is made than the door would take
uncompressed, and large payloads inflate off the event loop (~5 ms a MiB)."""

from __future__ import annotations

import asyncio
import zlib

from proxy.errors import Problem

WBITS = {"gzip": 31, "deflate": 15}
"""The encodings taken, as HTTP and gRPC both name them -> zlib's window bits (gzip's
framing; zlib's, which HTTP's and gRPC's `deflate` both mean)."""
OFF_LOOP_BYTES = 1 << 16


def taken(encoding: str) -> bool:
    return encoding in WBITS


async def inflated(payload: bytes | memoryview, encoding: str, limit: int) -> bytes:
    """`payload` as it was before `encoding` (one of WBITS) compressed it, at most `limit`
    bytes; Problem 413 past that, 400 when it does not inflate."""
    if len(payload) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_inflate, payload, encoding, limit)
    return _inflate(payload, encoding, limit)


def _inflate(payload: bytes | memoryview, encoding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(WBITS[encoding])
    try:
        data = inflater.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise Problem(400, f"the {encoding} data does not inflate: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise Problem(
            413, f"larger than the limit of {limit} bytes once inflated (PROXY_MAX_BODY_MB)"
        )
    if not inflater.eof:
        raise Problem(400, f"the {encoding} data is cut short")
    return data
