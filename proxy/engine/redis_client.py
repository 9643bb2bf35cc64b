"""One way to open a Redis client, for the inference cache and the jobs' queue.

`Redis.from_url` gives its connections no retry at all (unlike `Redis(host=...)`, whose
default retries ten times): after a Redis restart, every connection left in the pool then
fails its next command with "Connection closed by server", one request each. A CI run lost a
jobs listing that way, after the drain it was polling had long recovered. A retry on a fresh
connection is what a closed one needs; a timeout is not retried, so each call stays bounded
by its caller's timeout."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

MAX_CONNECTIONS = 128
"""A client's connections at most; a call beyond them waits for one (up to its timeout).
redis-py's own pool refuses the 101st at once ("Too many connections"): 600 cancels at once
failed, and so would a cache's lookups under more than 100 requests in flight."""


def connect(
    url: str, timeout_s: float, retries: int, backoff: bool, connect_timeout_s: float | None = None
) -> aioredis.Redis:
    """A client of `url` whose calls fail after `timeout_s` without an answer (a connection
    after `connect_timeout_s`, by default the same), and are sent again on a new connection
    up to `retries` times when theirs was closed (with a short jittered back-off, 10 ms
    doubling to 1 s, if `backoff`: a Redis that is restarting)."""
    wait = ExponentialWithJitterBackoff(base=0.01, cap=1.0) if backoff else NoBackoff()
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_timeout_s or timeout_s,
        health_check_interval=0,
        retry=Retry(wait, retries, supported_errors=(RedisConnectionError,)),
    )
    return aioredis.Redis.from_pool(pool)


_SCRIPT = re.compile(r"\.? script: [0-9a-f]{40}, on @user_script:\d+\.?")
"""Where Redis says which Lua script a refusal came from: noise for a client."""


def described(exc: BaseException) -> str:
    """An error of the client for a message: its class and text (redis-py's repr of its
    errors names only their category and class, e.g. `network:ConnectionError`)."""
    return f"{type(exc).__name__}: {_SCRIPT.sub('', str(exc))}"


def shown(url: str) -> str:
    """`url` without its user name and password: errors carrying the address reach clients
    (a 503's body) and the open /readyz, and once showed `redis://user:secret@...` there."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{parts.hostname or ''}{port}"))
