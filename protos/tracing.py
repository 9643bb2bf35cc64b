"""OpenTelemetry traces for every process of the mesh, off unless configured.

Configured by OpenTelemetry's own variables: on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names a receiver, or `OTEL_TRACES_EXPORTER` is
`otlp` or `console`; off when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
`OTEL_TRACES_SAMPLER` (and `_ARG`), `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, the
exporter's `OTEL_EXPORTER_OTLP_*` and the batch's `OTEL_BSP_*` mean what the SDK's mean.

Spans are recorded here and sent by trace_export.py as OTLP/gRPC (opentelemetry-proto's
messages), not by opentelemetry-sdk: measured on `digits` (bench/traces.py), the SDK's span
objects and exporter took ~30% of the proxy's CPU and traced throughput fell to 0.55x.
A span here is a slotted object and a context variable; the protobuf is built in a
background thread, in batches.

Off, a span costs one attribute test (`ENABLED`): the hot paths check it before they build
anything, so that a mesh without a receiver runs as it did before traces existed.

The W3C `traceparent` travels in gRPC metadata on unary calls and, on a ModelStreamInfer
stream (whose metadata is the stream's, not the request's), as the request's `traceparent`
parameter, sent only to servers that list TRACE_EXTENSION in their metadata.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import random
import re
import time
from collections.abc import Mapping, Sequence
from enum import IntEnum

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
"""The W3C header, gRPC metadata key and stream request parameter."""
TRACE_EXTENSION = "traceparent_parameter"
"""Listed in ServerMetadata's extensions by servers that read a streamed request's
`traceparent` parameter."""

ENABLED = False
"""Set once by `setup` when traces are configured."""
NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()
"""What a hot path enters instead of a span when traces are off."""

Attributes = Mapping[str, str | int | float | bool]


class SpanKind(IntEnum):
    """OTLP's values."""

    INTERNAL = 1
    SERVER = 2
    CLIENT = 3


class SpanContext:
    __slots__ = ("sampled", "span_id", "trace_id")

    def __init__(self, trace_id: int, span_id: int, sampled: bool) -> None:
        self.trace_id, self.span_id, self.sampled = trace_id, span_id, sampled

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"


class Span:
    """One operation; exported when it ends if its trace is sampled."""

    __slots__ = (
        "attributes",
        "context",
        "end_ns",
        "error",
        "kind",
        "links",
        "name",
        "parent_id",
        "start_ns",
    )

    def __init__(
        self,
        name: str,
        kind: SpanKind,
        attributes: Attributes | None,
        parent: SpanContext | None,
        links: Sequence[SpanContext],
        start_ns: int | None,
    ) -> None:
        sampler = _sampler  # its decision inlined: two calls a span fewer
        if parent is None:
            trace_id, self.parent_id = random.getrandbits(128) or 1, 0
            sampled = sampler.every or sampler.root(trace_id)
        else:
            trace_id, self.parent_id = parent.trace_id, parent.span_id
            if sampler.parent_based:
                sampled = parent.sampled
            else:
                sampled = sampler.every or sampler.root(trace_id)
        self.context = SpanContext(trace_id, random.getrandbits(64) or 1, sampled)
        self.name, self.kind = name, kind
        self.attributes = dict(attributes) if attributes else {}
        self.links = links
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self.end_ns = 0
        self.error: str | None = None

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        self.attributes[key] = value

    def end(self, end_ns: int | None = None) -> None:
        if self.end_ns:
            return
        self.end_ns = time.time_ns() if end_ns is None else end_ns
        if self.context.sampled and _exporter is not None:
            _exporter.add(self)


class _Sampler:
    """OTEL_TRACES_SAMPLER: always_on, always_off, traceidratio, and their parentbased_
    forms (the default: parentbased_always_on)."""

    def __init__(self, name: str = "parentbased_always_on", arg: str = "") -> None:
        self.parent_based = name.startswith("parentbased_")
        base = name.removeprefix("parentbased_")
        if base not in ("always_on", "always_off", "traceidratio"):
            log.warning("OTEL_TRACES_SAMPLER=%s is not known: parentbased_always_on", name)
            self.parent_based, base = True, "always_on"
        self.on = base != "always_off"
        try:
            ratio = float(arg) if base == "traceidratio" and arg else 1.0
        except ValueError:
            ratio = 1.0
        self.ratio = min(max(ratio, 0.0), 1.0) if base == "traceidratio" else 1.0
        self.bound = int(self.ratio * (1 << 64))
        self.every = self.on and self.ratio >= 1.0
        """Every root sampled (always_on): no decision to make."""

    def root(self, trace_id: int) -> bool:
        # traceidratio: the trace id's lower 64 bits below ratio x 2^64, as the SDK decides.
        return self.on and (self.ratio >= 1.0 or (trace_id & 0xFFFFFFFFFFFFFFFF) < self.bound)


_sampler = _Sampler()
_exporter = None  # trace_export.Exporter once set up
_CURRENT: contextvars.ContextVar[SpanContext | None] = contextvars.ContextVar("span", default=None)


def configured(environ: Mapping[str, str] | None = None) -> str | None:
    """The exporter the OTEL_* variables ask for ("otlp", "console"), None when off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter in ("otlp", "console"):
        return exporter
    if exporter == "" and (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return "otlp"
    if exporter not in ("", "none"):
        log.warning("OTEL_TRACES_EXPORTER=%s: not supported (otlp, console), traces off", exporter)
    return None


def setup(role: str) -> bool:
    """Turn traces on for this process when the OTEL_* variables ask for them."""
    global ENABLED, _exporter, _sampler
    kind = configured()
    if kind is None:
        return False
    from protos import trace_export

    env = os.environ
    _sampler = _Sampler(
        env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower(),
        env.get("OTEL_TRACES_SAMPLER_ARG", ""),
    )
    _exporter = trace_export.Exporter.from_environment(kind, f"mesh-{role}", env)
    ENABLED = True
    return True


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def extract(value: str | None) -> SpanContext | None:
    """The caller's context from a `traceparent` value (a header, metadata, a parameter),
    None without a valid one (W3C: version ff, all-zero ids and malformed values are
    ignored)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, bool(int(match.group(4), 16) & 1))


def traceparent() -> str | None:
    """The current span's `traceparent`, to send on."""
    current = _CURRENT.get()
    return None if current is None else current.traceparent


def current() -> SpanContext | None:
    """The current span's context (links and explicit parents)."""
    return _CURRENT.get()


def start(
    name: str,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes | None = None,
    parent: SpanContext | None = None,
    links: Sequence[SpanContext] = (),
    start_time: int | None = None,
) -> Span:
    """A span that is not made current (ended by its caller); `parent` None: the current."""
    return Span(name, kind, attributes, parent or _CURRENT.get(), links, start_time)


def activate(span: Span) -> contextvars.Token:
    """Make `span` current (until `deactivate` with the token)."""
    return _CURRENT.set(span.context)


def deactivate(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


class span:
    """A span, current inside the block; an exception marks it an error (and is raised).
    Only entered when ENABLED. A class rather than a generator: ~1.5 us less a span."""

    __slots__ = ("_span", "_token")

    def __init__(
        self,
        name: str,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes | None = None,
        parent: SpanContext | None = None,
        links: Sequence[SpanContext] = (),
    ) -> None:
        self._span = Span(name, kind, attributes, parent or _CURRENT.get(), links, None)

    def __enter__(self) -> Span:
        self._token = _CURRENT.set(self._span.context)
        return self._span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb) -> None:
        _CURRENT.reset(self._token)
        if exc is not None:
            self._span.error = f"{kind.__name__ if kind else 'Error'}: {exc}"[:300]
        self._span.end()


def error(current: Span, message: str) -> None:
    current.error = message[:300]


def ids() -> tuple[str, str] | None:
    """The current trace and span ids (hex), for log lines; None outside a span."""
    context = _CURRENT.get() if ENABLED else None
    if context is None:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def exemplar() -> dict[str, str] | None:
    """The current trace, for a histogram's exemplar (Prometheus shows the trace behind a
    slow bucket; served in the OpenMetrics format only)."""
    found = ids()
    return None if found is None else {"trace_id": found[0], "span_id": found[1]}
