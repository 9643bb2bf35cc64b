"""The REST doors' request spans (only when traces are on, protos/tracing.py): one SERVER
span per API call, a child of the client's `traceparent` when it sends one, with OTel's
`http.*` attributes and the request id; the pipeline's steps are its children. Health
checks, metrics and the docs get none (they would drown the requests). Made by the request
middleware (middleware.py), which already holds the headers and sees the status go out."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from protos import tracing
from protos.tracing import Span, SpanKind

TRACED_PREFIXES = ("/v1/", "/v2/")


def request_span(
    scope: Mapping[str, Any], headers: Mapping[bytes, bytes], request_id: str
) -> AbstractContextManager[Span | None]:
    path = scope["path"]
    if not path.startswith(TRACED_PREFIXES):
        return tracing.NO_SPAN
    given = headers.get(b"traceparent")
    parent = tracing.extract(given.decode("latin-1") if given else None)
    method = scope["method"]
    attributes = {"http.request.method": method, "url.path": path, "mesh.request_id": request_id}
    return tracing.span(f"{method} {path}", SpanKind.SERVER, attributes, parent)


def answered(span: Span, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        tracing.error(span, f"HTTP {status}")
