"""An OTLP/gRPC trace receiver on 127.0.0.1, on opentelemetry-proto's own service definitions
(what an OpenTelemetry Collector, Jaeger or Tempo serve on port 4317), for the tests, which
read the spans it got, and the benchmarks, which run it as its own process
(`python -m bench.otlp_receiver PORT`: counts spans, prints the count when stopped)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from bench.mesh import free_port


@dataclass(frozen=True)
class Received:
    service: str
    """The sender's `service.name`."""
    span: trace_pb2.Span

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    def attribute(self, name: str) -> str | int | float | bool | None:
        for kv in self.span.attributes:
            if kv.key == name:
                value = kv.value
                return getattr(value, value.WhichOneof("value") or "string_value")
        return None


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.spans: list[Received] = []
        self.count = 0
        self.lock = threading.Lock()

    def Export(self, request, context):
        if not self.keep:  # counting only (the benchmarks): as little CPU as it can
            count = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            with self.lock:
                self.count += count
            return trace_service_pb2.ExportTraceServiceResponse()
        got: list[Received] = []
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                got += [Received(service, span) for span in scope_spans.spans]
        with self.lock:
            self.count += len(got)
            self.spans += got
        return trace_service_pb2.ExportTraceServiceResponse()


class Receiver:
    """Started on a free port; `spans` are what every exporter sent so far."""

    def __init__(self, port: int | None = None, keep: bool = True) -> None:
        self.port = port or free_port()
        self._service = _Service(keep)
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self._service, self._server)
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def spans(self) -> list[Received]:
        with self._service.lock:
            return list(self._service.spans)

    @property
    def count(self) -> int:
        return self._service.count

    def clear(self) -> None:
        with self._service.lock:
            self._service.spans.clear()

    def wait_for(self, done: Callable[[list[Received]], bool], timeout_s: float = 20) -> bool:
        """Until `done(spans)` (exporters send in batches, every few seconds)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done(self.spans):
                return True
            time.sleep(0.2)
        return done(self.spans)

    def __enter__(self) -> Receiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)


def main() -> None:
    receiver = Receiver(int(sys.argv[1]), keep=False)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with receiver:
        print("ready", flush=True)
        stopped.wait()
    print(receiver.count, flush=True)


if __name__ == "__main__":
    main()
