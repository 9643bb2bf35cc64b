"""A pipeline step's span (when traces are on, protos/tracing.py): a child of the request's,
parent of its attempts (proxy/transport/calls.py) or, for a parallel step, of its branches'
steps. `mesh.status` is the status `/v1` reports for the step."""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager

from protos import tracing
from proxy.transport.target import Target


def step_span(label: str, target: Target | None) -> AbstractContextManager:
    return tracing.span(f"step {label}", attributes=_attributes(label, target))


@functools.lru_cache(maxsize=1024)
def _attributes(label: str, target: Target | None) -> dict[str, str]:
    attributes = {"mesh.step": label}
    if target is not None:
        attributes["mesh.model"] = target.model
        attributes["mesh.model_version"] = target.version
    return attributes
