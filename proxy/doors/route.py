"""One route of the proxy's table (routes.py): path, method, handler, documentation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    endpoint: Callable[..., Awaitable[Response]]
    docs: dict[str, Any] = field(default_factory=dict)
