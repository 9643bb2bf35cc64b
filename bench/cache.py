"""`python -m bench cache`: the inference cache on `digits`, measured in one run, rounds
interleaved, against the same mesh with the cache off (a proxy of the same kind with
PROXY_CACHE=false) and against the proxy's cheapest route (`/healthz`):

- every request a repeat (one image), c=32: cached throughput over uncached, and over the
  `/healthz` rate (the HTTP stack is then the limit);
- c=1 p50 of a hit over the uncached p50, in process and in Redis;
- no repeats at all (every image unique): throughput with the cache on over off, the
  cache's own cost (a key, a lookup, a write per request); at c=32 also over `--cost-rounds`
  more interleaved rounds, with the proxy's CPU a request (its own threads, from /proc), which
  this machine's +-10% between rounds moves far less than throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import redis_server
from bench.capacity import cpu_s
from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import (
    HEADER,
    http_closed_loop,
    median,
    row,
    second_proxy,
    second_proxy_process,
    shipped_mesh,
)

GOALS = """Goals (issue 26): repeats at c=32 >= 4x uncached and >= 0.5x /healthz; hit p50 at c=1 \
<= 0.3x uncached (Redis <= 0.5x); no repeats >= 0.97x the cache off."""


def digit() -> bytes:
    from sklearn.datasets import load_digits

    from samples.images import encode, render_digit

    return encode(render_digit(load_digits().images[0], scale=4))


def uploads(base: bytes, first: int, count: int) -> list[bytes]:
    """`count` uploads of the same PNG, each with bytes of its own after its end (decoders
    stop at IEND): no two are a repeat for the cache, and each costs the mesh the same."""
    return [base + b"\0" + i.to_bytes(8, "little") for i in range(first, first + count)]


def health_request(url: str) -> bytes:
    host = url.removeprefix("http://")
    return f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the inference cache on digits")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cost-rounds", type=int, default=8, help="rounds of the no-repeats cost at c=32"
    )
    args = parser.parse_args(argv)
    path = "/v1/pipelines/digits/infer"
    repeat = digit()
    cursor = [0]

    def fresh(count: int) -> list[bytes]:
        cursor[0] += count
        return uploads(repeat, cursor[0] - count, count)

    with contextlib.ExitStack() as stack:
        mesh = stack.enter_context(shipped_mesh("bench-cache"))
        env = mesh.services["proxy"].env
        # Three proxies of the same kind over the same services, the caches off, in process
        # and in Redis (the mesh's own proxy, with its gRPC door, is not measured).
        off, off_proc = stack.enter_context(second_proxy_process({**env, "PROXY_CACHE": "false"}))
        memory, memory_proc = stack.enter_context(
            second_proxy_process({**env, "PROXY_CACHE": "true"})
        )
        redis = redis_server.start(Path(tempfile.mkdtemp(prefix="bench-redis-")))
        stack.callback(redis.stop)
        shared = stack.enter_context(
            second_proxy({**env, "PROXY_CACHE": "true", "PROXY_CACHE_URL": redis.url})
        )

        def load(url: str, blobs: list[bytes], c: int) -> Stats:
            raw = [post_bytes(url + path, b, "image/png") for b in blobs]
            return asyncio.run(http_closed_loop(url, raw, c, args.duration))

        for url in (memory, shared):  # the repeat is cached before anything is measured
            load(url, [repeat], 1)
        systems = {
            "cache off, repeats": lambda c: load(off, [repeat], c),
            "cache in process, repeats": lambda c: load(memory, [repeat], c),
            "cache in Redis, repeats": lambda c: load(shared, [repeat], c),
            "/healthz": lambda c: asyncio.run(
                http_closed_loop(off, health_request(off), c, args.duration)
            ),
            "cache off, no repeats": lambda c: load(off, fresh(12_000), c),
            "cache in process, no repeats": lambda c: load(memory, fresh(12_000), c),
        }
        table: dict[int, dict[str, Stats]] = {}
        for c in (1, 32):
            runs: dict[str, list[Stats]] = {label: [] for label in systems}
            for _ in range(args.rounds):
                for label, measure in systems.items():
                    runs[label].append(measure(c))
            table[c] = {label: median(r) for label, r in runs.items()}
        costs = _costs(
            {"off": (off, off_proc.pid), "on": (memory, memory_proc.pid)},
            lambda url: load(url, fresh(12_000), 32),
            args.cost_rounds,
        )
    print("\n### `digits`: the inference cache\n")
    print(HEADER)
    for c, stats in table.items():
        base = stats["cache off, repeats"]
        for label, s in stats.items():
            print(row(label, c, s, base))
    one, many = table[1], table[32]
    off1 = one["cache off, repeats"]
    print(f"\n{GOALS}")
    hits = many["cache in process, repeats"].rps
    print(
        f"- repeats c=32: {hits / many['cache off, repeats'].rps:.2f}x uncached, "
        f"{hits / many['/healthz'].rps:.2f}x /healthz"
    )
    print(
        f"- hit p50 c=1: in process {one['cache in process, repeats'].p50_ms / off1.p50_ms:.2f}x, "
        f"Redis {one['cache in Redis, repeats'].p50_ms / off1.p50_ms:.2f}x the uncached p50"
    )
    for c in (1, 32):
        s = table[c]
        ratio = s["cache in process, no repeats"].rps / s["cache off, no repeats"].rps
        print(f"- no repeats c={c}: cache on {ratio:.2f}x the cache off")
    (on_rps, on_cpu), (off_rps, off_cpu) = costs["on"], costs["off"]
    print(
        f"- no repeats c=32 over {args.cost_rounds} more rounds (medians): cache on "
        f"{on_rps / off_rps:.2f}x the cache off ({on_rps:.0f} / {off_rps:.0f} req/s); the "
        f"proxy's CPU a request {on_cpu:.3f} / {off_cpu:.3f} ms = {on_cpu / off_cpu:.3f}x"
    )
    return 0


def _costs(
    proxies: dict[str, tuple[str, int]], load: Callable[[str], Stats], rounds: int
) -> dict[str, tuple[float, float]]:
    """Each proxy's median throughput and CPU ms a request over `rounds` interleaved."""
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in proxies}
    for _ in range(rounds):
        for name, (url, pid) in proxies.items():
            before = cpu_s(pid)[0]
            stats = load(url)
            seen[name].append((stats.rps, (cpu_s(pid)[0] - before) / stats.requests * 1000))
    return {
        name: (statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs))
        for name, runs in seen.items()
    }
