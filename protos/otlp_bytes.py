"""OTLP's trace messages as bytes, written directly (opentelemetry-proto's field numbers):
building them as protobuf objects cost 32 us a span, most of what traces cost the proxy.
What every span of one kind shares is written once (`encode_shape`, kept in tracing.Shape),
so a span costs its ids, times and own attributes. tests/unit/test_otlp_bytes.py reads
the bytes back with opentelemetry-proto's own parser."""

from __future__ import annotations

import functools
import struct
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protos.tracing import Span

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


_FLAGS = b"\x85\x01" + struct.pack("<I", 0x101)  # sampled; the parent's remoteness known
_TIMES = struct.Struct("<BQBQ")
_LENGTHS = [_varint(n) for n in range(4096)]
"""Most spans' lengths, their varints written once."""


def encode_shape(name: str, kind: int, attributes: Mapping[str, str | int | float | bool]) -> bytes:
    """The fields every span of a Shape shares: its name, kind, fixed attributes and flags
    (a message's fields may come in any order)."""
    fixed = b"".join(_attribute(k, v) for k, v in attributes.items())
    return _field(5, name.encode()) + b"\x30" + _varint(int(kind)) + fixed + _FLAGS


def encode(span: Span) -> bytes:
    """One span as ScopeSpans' `spans` field: OTLP's bytes written directly, the shape's
    part already written. Protobuf objects cost 32 us a span, this well under 2; a unit test
    checks it against opentelemetry-proto's own parser."""
    body = b"".join(
        (
            b"\x0a\x10",
            span.trace_id,
            b"\x12\x08",
            span.span_id,
            b"\x22\x08" if span.parent_id else b"",  # a root's parent_id is b""
            span.parent_id,
            span.shape.encoded,
            _TIMES.pack(0x39, span.start_ns, 0x41, span.end_ns),
        )
    )
    if span.attributes or span.links or span.error is not None:
        body += _extra(span)
    size = len(body)
    return b"\x12" + (_LENGTHS[size] if size < 4096 else _varint(size)) + body


def _extra(span: Span) -> bytes:
    """A span's own attributes, links and error status."""
    out = [_attribute(k, v) for k, v in span.attributes.items()] if span.attributes else []
    for link in span.links:
        out.append(_field(13, b"\x0a\x10" + link.trace_id + b"\x12\x08" + link.span_id))
    if span.error is not None:
        out.append(_field(15, _field(2, span.error.encode()) + b"\x18\x02"))  # ERROR
    return b"".join(out)


def request_bytes(resource: bytes, spans: Sequence[Span]) -> bytes:
    """An ExportTraceServiceRequest: one resource, one scope, `spans`."""
    scope = _field(1, SCOPE) + b"".join([encode(s) for s in spans])
    return _field(1, _field(1, resource) + _field(2, scope))


def resource_bytes(service: str, environ: Mapping[str, str]) -> bytes:
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
