"""Sending the spans tracing.py records: OTLP/gRPC to a receiver (opentelemetry-proto's
TraceService), or JSON lines on stderr (`OTEL_TRACES_EXPORTER=console`).

Ended spans wait in a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048: beyond, spans are
dropped and counted, never requests slowed); a background thread sends them in batches of
`OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512), at once when a batch is full, else every
`OTEL_BSP_SCHEDULE_DELAY` ms (5000). A process that exits sends what it holds first.
The receiver: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
(default http://localhost:4317; https or `OTEL_EXPORTER_OTLP_INSECURE=false`: TLS, with
`OTEL_EXPORTER_OTLP_CERTIFICATE` as the CA), `OTEL_EXPORTER_OTLP_HEADERS` (`k=v,...`),
`OTEL_EXPORTER_OTLP_TIMEOUT` (ms, 10000).
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from protos.otlp_bytes import request_bytes, resource_bytes
from protos.tracing import Span

log = logging.getLogger(__name__)


def _number(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return max(1, int(environ.get(name, "") or default))
    except ValueError:
        return default


class Exporter:
    """The queue and the thread that sends it."""

    def __init__(
        self,
        send: Callable[[Sequence[Span]], None],
        delay_s: float = 5.0,
        max_queue: int = 2048,
        max_batch: int = 512,
    ) -> None:
        self._send = send
        self._delay = delay_s
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._queue: collections.deque[Span] = collections.deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="trace-export", daemon=True)
        self._thread.start()
        atexit.register(self.flush)

    @classmethod
    def from_environment(cls, kind: str, service: str, environ: Mapping[str, str]) -> Exporter:
        if kind == "console":
            send = _console(environ.get("OTEL_SERVICE_NAME") or service)
        else:
            send = _otlp(resource_bytes(service, environ), environ)
        return cls(
            send,
            _number(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
            _number(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048),
            _number(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        )

    def add(self, span: Span) -> None:
        """From any thread: deque.append is atomic."""
        queue = self._queue
        if len(queue) >= self._max_queue:
            self.dropped += 1
            return
        queue.append(span)
        if len(queue) == self._max_batch:
            self._wake.set()

    def _take(self) -> list[Span]:
        batch: list[Span] = []
        queue = self._queue
        while queue and len(batch) < self._max_batch:
            batch.append(queue.popleft())
        return batch

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._send_all()

    def _send_all(self) -> None:
        with self._lock:
            if self.dropped:  # counted in `add`, said once per round
                log.warning("traces: %d spans dropped, the queue was full", self.dropped)
                self.dropped = 0
            while batch := self._take():
                try:
                    self._send(batch)
                except Exception as exc:  # a receiver down must not stop the next batches
                    log.warning("traces: %d spans not sent (%s)", len(batch), exc)

    def flush(self) -> None:
        self._send_all()


def _otlp(resource: bytes, environ: Mapping[str, str]) -> Callable:
    endpoint = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "http://localhost:4317"
    )
    parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    target = parsed.netloc or parsed.path
    insecure = environ.get("OTEL_EXPORTER_OTLP_INSECURE", "").strip().lower()
    secure = parsed.scheme == "https" or insecure == "false"
    if secure:
        ca = environ.get("OTEL_EXPORTER_OTLP_CERTIFICATE")
        root = open(ca, "rb").read() if ca else None  # noqa: SIM115 (read once, at start)
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root))
    else:
        channel = grpc.insecure_channel(target)
    export = channel.unary_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        request_serializer=None,  # the request is bytes already (request_bytes)
        response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString,
    )
    pairs = (h.partition("=") for h in environ.get("OTEL_EXPORTER_OTLP_HEADERS", "").split(","))
    headers = tuple(
        (k.strip().lower(), urllib.parse.unquote(v.strip())) for k, _, v in pairs if k.strip()
    )
    timeout = _number(environ, "OTEL_EXPORTER_OTLP_TIMEOUT", 10000) / 1000

    def send(spans: Sequence[Span]) -> None:
        export(request_bytes(resource, spans), timeout=timeout, metadata=headers)

    return send


def _console(service: str) -> Callable:

    def send(spans: Sequence[Span]) -> None:
        for span in spans:
            shape = span.shape
            line = {
                "service": service,
                "name": shape.name,
                "trace_id": span.trace_id.hex(),
                "span_id": span.span_id.hex(),
                "parent_id": span.parent_id.hex() if span.parent_id else None,
                "kind": shape.kind.name,
                "duration_ms": round((span.end_ns - span.start_ns) / 1e6, 3),
                "attributes": {**shape.attributes, **(span.attributes or {})},
                "error": span.error,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(span.start_ns / 1e9)),
            }
            print(json.dumps(line, default=str), file=sys.stderr, flush=True)

    return send
