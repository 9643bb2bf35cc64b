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
import functools
import json
import logging
import struct
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from protos.tracing import Span, SpanKind

log = logging.getLogger(__name__)

SCOPE = b"\x0a\x0einference-mesh"
"""The InstrumentationScope message (name)."""


_SMALL = [bytes([i]) for i in range(128)]


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _any_value(value: str | int | float | bool) -> bytes:
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64, two's complement
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    return _field(1, str(value).encode())


def _key_value(key: str, value: str | int | float | bool) -> bytes:
    return _field(1, key.encode()) + _field(2, _any_value(value))


@functools.lru_cache(maxsize=4096, typed=True)  # True is not 1
def _attribute(key: str, value: str | int | float | bool) -> bytes:
    """A span's attribute field. Most repeat from span to span (a model, a step, a method):
    written once."""
    return _field(9, _key_value(key, value))


@functools.lru_cache(maxsize=1024)
def _name(name: str) -> bytes:
    return _field(5, name.encode())


_KINDS = {kind: b"\x30" + _varint(int(kind)) for kind in SpanKind}
_FLAGS = b"\x85\x01" + struct.pack("<I", 0x101)  # sampled; the parent's remoteness known
_TIMES = struct.Struct("<BQBQ")


def encode(span: Span) -> bytes:
    """One OTLP `Span` message, its bytes written directly: building it as protobuf objects
    cost 32 us a span (most of what traces cost the proxy), this a fifth of it; a unit test
    checks it against opentelemetry-proto's own parser."""
    context = span.context
    head = b"\x0a\x10" + context.trace_id.to_bytes(16, "big")
    head += b"\x12\x08" + context.span_id.to_bytes(8, "big")
    if span.parent_id:
        head += b"\x22\x08" + span.parent_id.to_bytes(8, "big")
    out = [
        head,
        _name(span.name),
        _KINDS[span.kind],
        _TIMES.pack(0x39, span.start_ns, 0x41, span.end_ns),
        *[_attribute(k, v) for k, v in span.attributes.items()],
    ]
    for link in span.links:
        body = b"\x0a\x10" + link.trace_id.to_bytes(16, "big")
        out.append(_field(13, body + b"\x12\x08" + link.span_id.to_bytes(8, "big")))
    if span.error is not None:
        out.append(_field(15, _field(2, span.error.encode()) + b"\x18\x02"))  # ERROR
    out.append(_FLAGS)
    return b"".join(out)


def request_bytes(resource: bytes, spans: Sequence[Span]) -> bytes:
    """An ExportTraceServiceRequest: one resource, one scope, `spans`."""
    scope = _field(1, SCOPE) + b"".join(_field(2, encode(s)) for s in spans)
    return _field(1, _field(1, resource) + _field(2, scope))


def _resource(service: str, environ: Mapping[str, str]) -> bytes:
    """`service.name` (OTEL_SERVICE_NAME or the process's role), OTEL_RESOURCE_ATTRIBUTES."""
    attributes: dict[str, str] = {"telemetry.sdk.language": "python"}
    for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = urllib.parse.unquote(value.strip())
    attributes["service.name"] = environ.get("OTEL_SERVICE_NAME") or attributes.get(
        "service.name", service
    )
    return b"".join(_field(1, _key_value(k, v)) for k, v in attributes.items())


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
            send = _otlp(_resource(service, environ), environ)
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
            context = span.context
            line = {
                "service": service,
                "name": span.name,
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
                "parent_id": f"{span.parent_id:016x}" if span.parent_id else None,
                "kind": span.kind.name,
                "duration_ms": round((span.end_ns - span.start_ns) / 1e6, 3),
                "attributes": span.attributes,
                "error": span.error,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(span.start_ns / 1e9)),
            }
            print(json.dumps(line, default=str), file=sys.stderr, flush=True)

    return send
