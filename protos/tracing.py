"""OpenTelemetry traces for every process of the mesh, off unless configured.

Configured by OpenTelemetry's own variables: on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names a receiver, or `OTEL_TRACES_EXPORTER` is
`otlp` or `console`; off when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
`OTEL_TRACES_SAMPLER` (and `_ARG`), `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, the
exporter's `OTEL_EXPORTER_OTLP_*` and the batch's `OTEL_BSP_*` mean what the SDK's mean.

Spans are recorded here and sent by trace_export.py as OTLP/gRPC (opentelemetry-proto's
messages), not by opentelemetry-sdk: measured on `digits` (bench/traces.py), the SDK's span
objects and exporter took ~30% of the proxy's CPU and traced throughput fell to 0.55x.
A span here is a slotted object (its own context manager) and a context variable. What
every span of one kind shares (name, kind, fixed attributes: a Shape) is made and written as
OTLP bytes once (otlp_bytes.py), so a span carries only ids, times and what is its own;
the bytes are joined in a background thread, in batches. Ids are bytes, as OTLP wants them.

Off, a span costs one attribute test (`ENABLED`): the hot paths check it before they build
anything, so that a mesh without a receiver runs as it did before traces existed.

The W3C `traceparent` travels in gRPC metadata on unary calls and, on a ModelStreamInfer
stream (whose metadata is the stream's, not the request's), as the request's `traceparent`
parameter, sent only to servers that list TRACE_EXTENSION in their metadata.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from enum import IntEnum
from random import getrandbits
from time import time_ns

from protos import otlp_bytes

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

Value = str | int | float | bool
Attributes = dict[str, Value]


class SpanKind(IntEnum):
    """OTLP's values."""

    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    CONSUMER = 5


class SpanContext:
    """A caller's span (from its `traceparent`): a parent, never exported. Ids are bytes,
    as OTLP carries them."""

    __slots__ = ("sampled", "span_id", "trace_id")

    def __init__(self, trace_id: bytes, span_id: bytes, sampled: bool) -> None:
        self.trace_id, self.span_id, self.sampled = trace_id, span_id, sampled

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id.hex()}-{self.span_id.hex()}-{'01' if self.sampled else '00'}"


class Shape:
    """What every span of one kind shares (name, kind, fixed attributes), its OTLP bytes
    written once (otlp_bytes.py): a span then costs its ids and times, not its attributes
    again. Made by `shape`, cached."""

    __slots__ = ("attributes", "encoded", "kind", "name")

    def __init__(self, name: str, kind: SpanKind, attributes: Attributes) -> None:
        self.name, self.kind, self.attributes = name, kind, attributes
        self.encoded = otlp_bytes.encode_shape(name, kind, self.attributes)


@functools.lru_cache(maxsize=4096)
def shape(
    name: str,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: tuple[tuple[str, Value], ...] = (),
) -> Shape:
    """The Shape of spans named `name` with these fixed attributes (pairs: hashable)."""
    return Shape(name, kind, dict(attributes))


class Span(SpanContext):
    """One operation; exported when it ends if its trace is sampled. Entered as a context
    manager, it is the current span inside the block (an exception marks it an error and
    is raised); made and not entered, it is not current (its maker ends it)."""

    __slots__ = (
        "_token",
        "attributes",
        "end_ns",
        "error",
        "links",
        "parent_id",
        "shape",
        "start_ns",
    )

    def __init__(
        self,
        shape: Shape,
        parent: SpanContext | None = None,
        links: Sequence[SpanContext] = (),
        start_ns: int = 0,
        attributes: Attributes | None = None,
    ) -> None:
        if parent is None:
            parent = _CURRENT.get()
        sampler = _sampler  # its decision inlined: two calls a span fewer
        if parent is None:
            number = getrandbits(128) or 1
            self.trace_id, self.parent_id = number.to_bytes(16, "big"), b""
            self.sampled = sampler.every or sampler.root(number)
        else:
            self.trace_id, self.parent_id = parent.trace_id, parent.span_id
            if sampler.parent_based:
                self.sampled = parent.sampled
            else:
                self.sampled = sampler.every or sampler.root(int.from_bytes(parent.trace_id))
        self.span_id = (getrandbits(64) or 1).to_bytes(8, "big")
        self.shape = shape
        self.attributes = attributes
        """This span's own attributes, beside its shape's (None: none)."""
        self.links = links
        self.start_ns = start_ns or time_ns()
        self.end_ns = 0
        self.error: str | None = None

    def set_attribute(self, key: str, value: Value) -> None:
        if self.attributes is None:
            self.attributes = {key: value}
        else:
            self.attributes[key] = value

    def end(self, end_ns: int = 0) -> None:
        if self.end_ns:
            return
        self.end_ns = end_ns or time_ns()
        if self.sampled and _exporter is not None:
            _exporter.add(self)

    def __enter__(self) -> Span:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb) -> None:
        _CURRENT.reset(self._token)
        if exc is not None:
            self.error = f"{kind.__name__ if kind else 'Error'}: {exc}"[:300]
        self.end()


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
_CURRENT: contextvars.ContextVar[Span | None] = contextvars.ContextVar("span", default=None)


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


def extract(value: str | None) -> SpanContext | None:
    """The caller's context from a `traceparent` value (a header, metadata, a parameter),
    None without a valid one (W3C: version ff, all-zero ids and malformed values are
    ignored; a later version may add fields after a dash). Sliced, not matched by a regular
    expression: a third of the cost, on every call a service answers."""
    if not value:
        return None
    text = value.strip()
    size = len(text)
    if (
        size < 55
        or text[2] != "-"
        or text[35] != "-"
        or text[52] != "-"
        or (size > 55 and (text[:2] == "00" or text[55] != "-"))
    ):
        return None
    try:  # fromhex skips spaces: the lengths say whether every character was a digit
        version, flags = bytes.fromhex(text[:2]), bytes.fromhex(text[53:55])
        trace_id, span_id = bytes.fromhex(text[3:35]), bytes.fromhex(text[36:52])
    except ValueError:
        return None
    if (
        len(trace_id) != 16
        or len(span_id) != 8
        or len(version) != 1
        or len(flags) != 1
        or version == b"\xff"
        or not any(trace_id)
        or not any(span_id)
    ):
        return None
    return SpanContext(trace_id, span_id, bool(flags[0] & 1))


def traceparent() -> str | None:
    """The current span's `traceparent`, to send on."""
    current = _CURRENT.get()
    return None if current is None else current.traceparent


def current() -> Span | None:
    """The current span (links and explicit parents)."""
    return _CURRENT.get()


def activate(span: Span) -> contextvars.Token:
    """Make `span` current (until `deactivate` with the token)."""
    return _CURRENT.set(span)


def deactivate(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


def span(
    shape: Shape,
    parent: SpanContext | None = None,
    links: Sequence[SpanContext] = (),
    attributes: Attributes | None = None,
) -> Span:
    """A span to enter (current inside the block). Only made when ENABLED."""
    return Span(shape, parent, links, 0, attributes)


def error(current: Span, message: str) -> None:
    current.error = message[:300]


def ids() -> tuple[str, str] | None:
    """The current trace and span ids (hex), for log lines; None outside a span."""
    current = _CURRENT.get() if ENABLED else None
    if current is None:
        return None
    return current.trace_id.hex(), current.span_id.hex()


def exemplar() -> dict[str, str] | None:
    """The current trace, for a histogram's exemplar (Prometheus shows the trace behind a
    slow bucket; served in the OpenMetrics format only)."""
    found = ids()
    return None if found is None else {"trace_id": found[0], "span_id": found[1]}
