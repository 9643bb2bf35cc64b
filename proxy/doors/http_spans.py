"""The REST doors' request spans (only when traces are on, protos/tracing.py): one SERVER
span per API call, a child of the client's `traceparent` when it sends one, with OTel's
`http.*` attributes and the request id; the pipeline's steps are its children. Health
checks, metrics and the docs get none (they would drown the requests). Made by the request
middleware (middleware.py), which already holds the headers and sees the status go out."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from protos import tracing
from protos.tracing import Shape, Span, SpanKind

TRACED_PREFIXES = ("/v1/", "/v2/")


def request_span(
    scope: Mapping[str, Any], headers: Mapping[bytes, bytes], request_id: str
) -> AbstractContextManager[Span | None]:
    path = scope["path"]
    if not path.startswith(TRACED_PREFIXES):
        return tracing.NO_SPAN
    given = headers.get(b"traceparent")
    parent = tracing.extract(given.decode("latin-1") if given else None)
    return tracing.span(
        _shape(scope["method"], path), parent, attributes={"mesh.request_id": request_id}
    )


@functools.lru_cache(maxsize=1024)  # paths name pipelines: a few, and bounded if not
def _shape(method: str, path: str) -> Shape:
    attributes = (("http.request.method", method), ("url.path", path))
    return tracing.shape(f"{method} {path}", SpanKind.SERVER, attributes)


def answered(span: Span, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        tracing.error(span, f"HTTP {status}")
