"""Many calls of one Lua script in one pipeline, without redis-py's check that it is loaded.

Before every execute, redis-py's pipeline asks Redis whether each script it carries is loaded
(SCRIPT EXISTS): one more round trip for every group of submissions, ~6% of an enqueue's
time on the event loop with the jobs in Redis. Here each call goes as EVALSHA; the calls
Redis answers NOSCRIPT (a Redis restarted without its scripts, or SCRIPT FLUSH) never ran,
and are sent again once the script is loaded."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

Call = tuple[list[Any], list[Any]]
"""A call's keys and arguments."""


async def evalsha_many(redis: Redis, script: AsyncScript, calls: list[Call]) -> list[Any]:
    """Each call's reply, in order; a call's own error (e.g. Redis out of memory) as its
    reply, not raised; a connection's error raised."""
    replies = await _send(redis, script.sha, calls)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        script.sha = await redis.script_load(script.script)
        again = await _send(redis, script.sha, [calls[i] for i in missing])
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
    return replies


async def _send(redis: Redis, sha: str, calls: list[Call]) -> list[Any]:
    async with redis.pipeline(transaction=False) as pipe:
        for keys, args in calls:
            pipe.evalsha(sha, len(keys), *keys, *args)
        return await pipe.execute(raise_on_error=False)
