"""The bytes one request holds, counted against the proxy's bytes in flight (admission.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy import metrics
from proxy.errors import Problem

if TYPE_CHECKING:
    from proxy.engine.admission import Admission


class Ledger:
    """The bytes one request holds; released together when it ends."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.held = 0

    def hold(self, nbytes: int) -> None:
        if self.held + nbytes > self.admission.max_request_bytes:
            raise Problem(
                413,
                f"the request's tensors would exceed {self.admission.max_request_bytes >> 20} "
                "MiB (PROXY_MAX_REQUEST_MB)",
            )
        self.held += nbytes
        self.admission.bytes_in_flight += nbytes
        if self.admission.sets_gauges:
            metrics.BYTES_IN_FLIGHT.set(self.admission.bytes_in_flight)

    def hold_upload(self, nbytes: int) -> None:
        """`hold` for bytes a client is still sending, refused (503 + Retry-After) when the
        proxy would pass its bytes in flight. The room is checked as each request starts,
        but requests that start together each find it: 64 OCR pages of 17.7 MiB sent at
        once took a proxy whose bound was 256 MiB to 2 GiB. The connection stays open: the
        server drops the rest of the body unread and unkept, and the client, which sends
        it all before it reads, gets the 503 (closed, it got a reset: 44 of 64). An upload
        larger than the bound passes while it is alone, as an image larger than a pipeline's
        pixel budget does (its own limits still hold: PROXY_MAX_REQUEST_MB, the body's)."""
        admission = self.admission
        others = admission.bytes_in_flight - self.held
        if others and admission.bytes_in_flight + nbytes > admission.max_bytes:
            raise admission.full()
        self.hold(nbytes)

    def release(self, nbytes: int) -> None:
        nbytes = min(nbytes, self.held)
        self.held -= nbytes
        self.admission.bytes_in_flight -= nbytes
        if self.admission.sets_gauges:
            metrics.BYTES_IN_FLIGHT.set(self.admission.bytes_in_flight)

    def close(self) -> None:
        self.release(self.held)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
