"""A job's callback: its final state POSTed to a URL the client gave (tried until delivered:
outbox.py), and only to hosts the operator allows (PROXY_JOBS_CALLBACK_HOSTS): without the
list, a client could make the proxy call anything it can reach (server-side request
forgery)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from protos.errors import capped
from proxy.errors import Problem


def allowed_hosts(setting: str) -> frozenset[str]:
    """`host` or `host:port` entries, comma-separated; lower-cased."""
    return frozenset(h.strip().lower() for h in setting.split(",") if h.strip())


SHOWN = 120
"""Characters of a refused URL repeated in the error (the query string may hold 32 KiB)."""


def check(url: str, allowed: frozenset[str]) -> str:
    """`url` when the proxy may POST to it; 400 naming why not."""
    shown = _shown(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed [IPv6 literal
        raise Problem(400, f"callback {shown} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Problem(400, f"callback {shown} is not an http(s) URL")
    if parts.username or parts.password:
        raise Problem(400, "a callback URL may not carry credentials")
    if not allowed:
        raise Problem(
            400, "callbacks are off: the operator allows no hosts (PROXY_JOBS_CALLBACK_HOSTS)"
        )
    host = parts.hostname.lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Problem(400, f"callback {shown} has a bad port") from None
    if host not in allowed and f"{host}:{port}" not in allowed:
        raise Problem(
            400,
            f"callback host {_shown(f'{host}:{port}')} is not allowed (PROXY_JOBS_CALLBACK_HOSTS)",
        )
    return url


def _shown(text: str) -> str:
    return repr(capped(text, SHOWN))


async def post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[str, bool]:
    """One try of a callback: how it went, and whether that is its end ("delivered", or
    "refused: ..." for a 4xx other than 408 and 429: the receiver would refuse it again)."""
    try:
        answer = await client.post(
            url, content=orjson.dumps(body), headers={"Content-Type": "application/json"}
        )
    except httpx.HTTPError as exc:
        return capped(f"{type(exc).__name__}: {exc}", SHOWN), False
    if answer.is_success:
        return "delivered", True
    if 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
        return f"refused: HTTP {answer.status_code}", True
    return f"HTTP {answer.status_code}", False
