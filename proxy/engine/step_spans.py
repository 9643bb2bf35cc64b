"""A pipeline step's span (when traces are on, protos/tracing.py): a child of the request's,
parent of its attempts (proxy/transport/calls.py) or, for a parallel step, of its branches'
steps. `mesh.status` is the status `/v1` reports for the step. A shadow's copy of a call has
a span of its own under the step's."""

from __future__ import annotations

import functools

from protos import tracing
from protos.tracing import Shape, Span, SpanKind
from proxy.transport.target import Target


def step_span(label: str, target: Target | None) -> Span:
    # Keyed by strings, not by the Target: a dataclass's hash is a Python call.
    if target is None:
        return tracing.span(_shape("step", label, None, None))
    return tracing.span(_shape("step", label, target.model, target.version))


def shadow_span(label: str, target: Target) -> Span:
    """A copy of a step's call to its shadow (proxy/engine/shadows.py): a child of the step's
    span, which it may outlive (it is sent once the live call has answered), parent of its
    attempt; `mesh.shadow.outcome` and `mesh.shadow.differs` say how it compared."""
    return tracing.span(_shape("shadow", label, target.model, target.version))


@functools.lru_cache(maxsize=1024)
def _shape(kind: str, label: str, model: str | None, version: str | None) -> Shape:
    """A step's (or its shadow's) span name and attributes, made once per step."""
    attributes = [("mesh.step", label)]
    if model is not None and version is not None:
        attributes += [("mesh.model", model), ("mesh.model_version", version)]
    return tracing.shape(f"{kind} {label}", SpanKind.INTERNAL, tuple(attributes))
