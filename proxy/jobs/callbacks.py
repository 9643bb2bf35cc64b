"""A job's callback: its final state POSTed to a URL the client gave (tried until delivered:
outbox.py), and only to hosts the operator allows (PROXY_JOBS_CALLBACK_HOSTS): without the
list, a client could make the proxy call anything it can reach (server-side request
forgery). Signed when the operator sets a secret (PROXY_JOBS_CALLBACK_SECRET), so that a
receiver can tell a callback of the mesh from a forged one."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
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


SIGNATURE = "X-Mesh-Signature"
JOB_ID = "X-Mesh-Job-Id"


def signature(secret: bytes, at: int, payload: bytes) -> str:
    """The signature header's value: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<payload>">`
    (the timestamp signed with the body, so that a callback replayed later is told apart)."""
    mac = hmac.new(secret, b"%d.%s" % (at, payload), hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


def verify(
    secret: bytes, header: str, payload: bytes, now: float, tolerance_s: float = 300
) -> bool:
    """What a receiver checks: the header signs `payload` with `secret`, less than
    `tolerance_s` from `now`."""
    fields = dict(part.partition("=")[::2] for part in header.split(","))
    try:
        at = int(fields.get("t", ""))
    except ValueError:
        return False
    if abs(now - at) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, at, payload), f"t={at},v1={fields.get('v1', '')}")


TRY_S = 10.0
"""A try's whole bound, its answer's head included (httpx's own timeout bounds each read:
a receiver sending a byte at a time never ended a try)."""
ANSWER_READ = 64 * 1024
"""Bytes of a receiver's answer read at most: what it says is its status; a small body is
read so that the connection is kept for the next callback, an endless one is not."""


async def post(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    secret: bytes | None = None,
    total_s: float = TRY_S,
) -> tuple[str, bool]:
    """One try of a callback: how it went, and whether that is its end ("delivered", or
    "refused: ..." for a 4xx other than 408 and 429, or a redirect: the receiver would say
    the same again). Signed with `secret` when there is one."""
    payload = orjson.dumps(body)
    headers = {"Content-Type": "application/json", JOB_ID: str(body["id"])}
    if secret:
        headers[SIGNATURE] = signature(secret, int(time.time()), payload)
    try:
        async with asyncio.timeout(total_s):
            async with client.stream("POST", url, content=payload, headers=headers) as answer:
                read = 0
                async for chunk in answer.aiter_raw():
                    read += len(chunk)
                    if read > ANSWER_READ:
                        break  # closed unread: the connection is not kept
    except TimeoutError:
        return f"no answer within {total_s:g} s", False
    except httpx.HTTPError as exc:
        return capped(f"{type(exc).__name__}: {exc}", SHOWN), False
    status = answer.status_code
    if answer.is_success:
        return "delivered", True
    if answer.is_redirect:  # never followed (the allowed hosts would not hold)
        return f"refused: HTTP {status}, a redirect (not followed)", True
    if 400 <= status < 500 and status not in (408, 429):
        return f"refused: HTTP {status}", True
    return f"HTTP {status}", False
