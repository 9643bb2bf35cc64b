"""What a Redis must be for the jobs' queue not to lose what it accepted, checked when the
queue first reaches it (and again after a reconnect: it may be another server now).

Two settings of the server decide it, neither of them the proxy's:
- `maxmemory-policy`: an `allkeys-*` policy evicts any key once Redis is full, a queued
  job's included (the queue's keys have no TTL, so `volatile-*` and `noeviction` spare them);
  a Redis set up as a cache often runs `allkeys-lru`;
- the append-only file: without it, a restart of Redis loses every job accepted since its
  last snapshot.
Neither is a reason to refuse jobs (a Redis with no `maxmemory` never evicts; a managed one
may replicate instead of logging), so each is said once, as a warning naming the setting.
Read from INFO, which managed services answer where they refuse CONFIG."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import RedisError

EVICTING = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


async def warnings(redis: aioredis.Redis, shown: str) -> list[str]:
    """What of this Redis may lose accepted jobs (`shown`: its address, without
    credentials); nothing when it cannot say (INFO refused)."""
    try:
        memory = await redis.info("memory")
        persistence = await redis.info("persistence")
    except (RedisError, OSError):
        return []
    said = []
    policy, most = memory.get("maxmemory_policy"), int(memory.get("maxmemory") or 0)
    if most and policy in EVICTING:
        said.append(
            f"Redis {shown} evicts any key when full (maxmemory-policy {policy}, maxmemory "
            f"{most} bytes): queued jobs can be lost; set volatile-lru or noeviction"
        )
    if str(persistence.get("aof_enabled", "1")) == "0":
        said.append(
            f"Redis {shown} keeps no append-only file (appendonly no): a restart of Redis "
            "loses the jobs accepted since its last snapshot; set appendonly yes"
        )
    return said
