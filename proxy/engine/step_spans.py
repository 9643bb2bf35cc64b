"""A pipeline step's span (when traces are on, protos/tracing.py): a child of the request's,
parent of its attempts (proxy/transport/calls.py) or, for a parallel step, of its branches'
steps. `mesh.status` is the status `/v1` reports for the step."""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager

from protos import tracing
from proxy.transport.target import Target


def step_span(label: str, target: Target | None) -> AbstractContextManager:
    # Keyed by strings, not by the Target: a dataclass's hash is a Python call.
    if target is None:
        name, attributes = _named(label, None, None)
    else:
        name, attributes = _named(label, target.model, target.version)
    return tracing.span(name, attributes=attributes)


@functools.lru_cache(maxsize=1024)
def _named(label: str, model: str | None, version: str | None) -> tuple[str, dict[str, str]]:
    """The span's name and attributes, made once per step."""
    attributes = {"mesh.step": label}
    if model is not None and version is not None:
        attributes["mesh.model"] = model
        attributes["mesh.model_version"] = version
    return f"step {label}", attributes
