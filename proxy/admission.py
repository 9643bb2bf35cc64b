"""What the proxy lets in: requests in flight, and the bytes they hold.

Bytes count from the first byte of an upload to the last tensor a request keeps, so a
flood of large requests is shed at the door (503 + Retry-After) while the proxy still
has the memory to answer the requests it took, instead of taking them all and answering
none in time (32 OCR pages of 3000x3000 held 4.9 GB and answered 3 of 65 in time).
"""

from __future__ import annotations

import asyncio

from proxy import metrics
from proxy.problems import Problem


class Admission:
    def __init__(self, max_requests: int, max_bytes: int, max_request_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.max_request_bytes = max_request_bytes
        self._slots = asyncio.Semaphore(max_requests)
        self.bytes_in_flight = 0

    def check_room(self) -> None:
        """Before taking a request on: 503 when the proxy holds its budget of bytes."""
        if self.bytes_in_flight >= self.max_bytes:
            raise Problem(
                503,
                f"proxy at capacity ({self.bytes_in_flight >> 20} MiB of requests in flight, "
                f"limit {self.max_bytes >> 20} MiB)",
            )

    def slot(self) -> asyncio.Semaphore:
        """A pipeline slot; refused at once (503) when all are taken."""
        if self._slots.locked():
            raise Problem(503, f"proxy at capacity ({self.max_requests} requests in flight)")
        return self._slots

    def ledger(self) -> Ledger:
        return Ledger(self)


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
        metrics.BYTES_IN_FLIGHT.set(self.admission.bytes_in_flight)

    def release(self, nbytes: int) -> None:
        nbytes = min(nbytes, self.held)
        self.held -= nbytes
        self.admission.bytes_in_flight -= nbytes
        metrics.BYTES_IN_FLIGHT.set(self.admission.bytes_in_flight)

    def close(self) -> None:
        self.release(self.held)
