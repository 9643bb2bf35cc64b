"""Bodies read with one timer moved on as bytes arrive: a steady upload outlives the
grace period, a trickle is cut off, and a client that hangs up mid-upload is gone, not
a bug answered with a 500."""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

import numpy as np
import pytest
from starlette.requests import Request

from proxy.doors.middleware import RequestContext
from proxy.doors.uploads import UploadLimits, read_body
from proxy.engine.admission import Admission
from proxy.engine.ledger import Ledger
from proxy.errors import Problem

SCOPE = {"type": "http", "method": "POST", "path": "/upload", "headers": []}


def paced(chunks: list[bytes], pause_s: float, then_hang_up: bool = False) -> Any:
    """An ASGI receive handing out `chunks` `pause_s` apart, then the end of the body or
    a disconnect."""
    messages = iter(chunks)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(pause_s)
        chunk = next(messages, None)
        if chunk is None:
            if then_hang_up:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    return receive


async def _read(
    receive: Any, limits: UploadLimits, budget_s: float = 5.0, ledger: Ledger | None = None
) -> bytes:
    deadline = asyncio.get_running_loop().time() + budget_s
    return await read_body(Request(SCOPE, receive), limits, deadline, ledger)


async def test_a_steady_upload_outlives_the_grace_period() -> None:
    """8 KB over ~0.45 s at ~18 KB/s, a 0.1 s grace and a 1 KB/s floor: the timer must
    move on with every chunk, or it fires at the end of the grace."""
    limits = UploadLimits(max_bytes=1 << 20, min_rate_bps=1024, grace_s=0.1)
    body = await _read(paced([bytes([i]) * 1000 for i in range(8)], 0.05), limits)
    assert body == b"".join(bytes([i]) * 1000 for i in range(8))


async def test_a_trickle_is_cut_off_once_under_the_floor() -> None:
    limits = UploadLimits(max_bytes=1 << 20, min_rate_bps=1024, grace_s=0.1)
    with pytest.raises(Problem) as refused:
        await _read(paced([b"x"] * 100, 0.05), limits)
    assert refused.value.status == 408 and "slower than 1 KiB/s" in refused.value.message


async def test_the_budget_bounds_the_upload() -> None:
    limits = UploadLimits(max_bytes=1 << 20, min_rate_bps=1, grace_s=10)
    with pytest.raises(Problem) as refused:
        await _read(paced([b"x"] * 100, 0.05), limits, budget_s=0.2)
    assert refused.value.status == 408 and "time budget ran out" in refused.value.message


async def test_a_client_gone_mid_upload_is_answered_nothing_and_logged_as_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = UploadLimits(max_bytes=1 << 20)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await _read(receive, limits)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with caplog.at_level(logging.ERROR):
        await RequestContext(app, None, set())(
            dict(SCOPE), paced([b"x" * 100], 0.01, then_hang_up=True), send
        )
    assert sent == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_uploads_arriving_together_stop_at_the_bytes_in_flight() -> None:
    """Three uploads of 2,000 bytes at once into room for 3,000: the bytes held never pass
    the bound, the upload that would pass it is refused (503) and
    lets its bytes go, and the others are read whole."""
    admission = Admission(10, 3000, 1 << 20)
    limits = UploadLimits(max_bytes=1 << 20)
    peak = 0

    def watched(chunks: list[bytes]) -> Any:
        receive = paced(chunks, 0.01)

        async def counting() -> dict[str, Any]:
            nonlocal peak
            peak = max(peak, admission.bytes_in_flight)
            return await receive()

        return counting

    async def upload() -> bytes:
        ledger = admission.ledger()
        try:
            return await _read(watched([b"x" * 500] * 4), limits, ledger=ledger)
        except Problem:
            ledger.close()  # as the request's ticket does when it ends
            raise

    results = await asyncio.gather(*(upload() for _ in range(3)), return_exceptions=True)
    refused = [r for r in results if isinstance(r, Problem)]
    assert refused and all(r.status == 503 for r in refused)
    assert [r for r in results if isinstance(r, bytes)] == [b"x" * 2000] * (3 - len(refused))
    assert len(refused) < 3 and peak <= 3000 and admission.bytes_in_flight <= 3000


def _encoded(receive: Any, encoding: str) -> Request:
    return Request({**SCOPE, "headers": [(b"content-encoding", encoding.encode())]}, receive)


def _packed(data: bytes, encoding: str) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, {"gzip": 31, "deflate": 15}[encoding])
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP"])
@pytest.mark.parametrize("size", [3000, 300_000], ids=["small", "inflated-off-the-loop"])
async def test_a_compressed_body_is_read_as_it_was(encoding: str, size: int) -> None:
    """tritonclient's request_compression_algorithm: Content-Encoding gzip or deflate. Its
    inflated bytes count on the proxy's bytes in flight too."""
    data = np.random.default_rng(size).integers(0, 4, size, np.uint8).tobytes()
    packed = _packed(data, encoding.lower())
    admission = Admission(100, 1 << 30, 1 << 30)
    deadline = asyncio.get_running_loop().time() + 5
    with admission.ledger() as ledger:
        body = await read_body(
            _encoded(paced([packed], 0), encoding), UploadLimits(1 << 20), deadline, ledger
        )
        assert body == data
        assert admission.bytes_in_flight == len(packed) + len(data)


@pytest.mark.parametrize(
    ("sent", "encoding", "status", "says"),
    [
        (_packed(b"\0" * (8 << 20), "gzip"), "gzip", 413, "once inflated (PROXY_MAX_BODY_MB)"),
        (_packed(b"an image" * 100, "gzip")[:-8], "gzip", 400, "the gzip data is cut short"),
        (b"not compressed", "deflate", 400, "the deflate data does not inflate"),
        (b"whatever", "br", 415, "Content-Encoding 'br' is not supported"),
    ],
    ids=["bomb", "cut-short", "garbage", "unknown-encoding"],
)
async def test_a_compressed_body_that_does_not_inflate_is_refused_by_name(
    sent: bytes, encoding: str, status: int, says: str
) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    with pytest.raises(Problem) as refused:
        await read_body(_encoded(paced([sent], 0), encoding), UploadLimits(1 << 20), deadline)
    assert refused.value.status == status and says in refused.value.message
