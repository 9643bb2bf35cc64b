"""`python -m bench cache`: the inference cache on `digits`, measured in one run, rounds
interleaved, against the same mesh with the cache off (a proxy of the same kind with
PROXY_CACHE=false) and against the proxy's cheapest route (`/healthz`):

- every request a repeat (one image), c=32: cached throughput over uncached, and over the
  `/healthz` rate (the HTTP stack is then the limit);
- c=1 p50 of a hit over the uncached p50, in process and in Redis;
- no repeats at all (every image unique): throughput with the cache on over off, the
  cache's own cost (a key, a lookup, a doorkeeper's test per request: `digits` ships with
  `admit: second`); also over `--cost-rounds` more interleaved rounds, with the
  proxy's CPU a request (its own threads, from /proc), which this machine's +-10% between
  rounds moves far less than throughput; and the same for a proxy whose `digits` keeps every
  answer (`admit: first`), the cost `admit: second` spares.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import redis_server
from bench.capacity import cpu_s
from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import (
    HEADER,
    ROOT,
    http_closed_loop,
    median,
    row,
    second_proxy,
    second_proxy_process,
    shipped_mesh,
)


@dataclass(frozen=True)
class Cost:
    rps: float
    cpu_ms: float
    """The proxy's own CPU a request."""
    rps_ratio: float
    cpu_ratio: float
    """Over the baseline's, round by round (the median of the rounds' ratios)."""


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
        "--cost-rounds",
        type=int,
        default=8,
        help="rounds of the no-repeats cost, at c=1 and at c=32",
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
        first = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-cache-")) + "/p.yaml"
        Path(first).write_text(_admit_first((ROOT / "proxy" / "pipelines.yaml").read_text()))
        every, every_proc = stack.enter_context(
            second_proxy_process({**env, "PROXY_CACHE": "true", "PROXY_PIPELINES": first})
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
            load(url, [repeat], 1)  # (seen again and again: kept whatever `admit` says)
        systems = {
            "cache off, repeats": lambda c: load(off, [repeat], c),
            "cache in process, repeats": lambda c: load(memory, [repeat], c),
            "cache in Redis, repeats": lambda c: load(shared, [repeat], c),
            "/healthz": lambda c: asyncio.run(
                http_closed_loop(off, health_request(off), c, args.duration)
            ),
            "cache off, no repeats": lambda c: load(off, fresh(12_000), c),
            "cache in process, no repeats": lambda c: load(memory, fresh(12_000), c),
            "cache, admit: first, no repeats": lambda c: load(every, fresh(12_000), c),
        }
        table: dict[int, dict[str, Stats]] = {}
        for c in (1, 32):
            runs: dict[str, list[Stats]] = {label: [] for label in systems}
            labels = list(systems)
            for turn in range(args.rounds):  # the order turns: no system always first
                for label in labels[turn % len(labels) :] + labels[: turn % len(labels)]:
                    runs[label].append(systems[label](c))
            table[c] = {label: median(r) for label, r in runs.items()}
        compared = {
            "off": (off, off_proc.pid),
            "on": (memory, memory_proc.pid),
            "first": (every, every_proc.pid),
        }
        costs = {
            c: _costs(compared, lambda url, c=c: load(url, fresh(12_000), c), args.cost_rounds)
            for c in (1, 32)
        }
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
        every_ratio = s["cache, admit: first, no repeats"].rps / s["cache off, no repeats"].rps
        print(
            f"- no repeats c={c}: cache on {ratio:.2f}x the cache off "
            f"(admit: first {every_ratio:.2f}x)"
        )
    for c, measured in costs.items():
        off = measured["off"]
        for name, label in (("on", "cache on"), ("first", "cache on, admit: first")):
            cost = measured[name]
            print(
                f"- no repeats c={c} over {args.cost_rounds} more rounds (medians of each "
                f"round's ratio): {label} {cost.rps_ratio:.2f}x the cache off ({cost.rps:.0f} "
                f"/ {off.rps:.0f} req/s); the proxy's CPU a request {cost.cpu_ratio:.3f}x "
                f"({cost.cpu_ms:.3f} / {off.cpu_ms:.3f} ms)"
            )
    return 0


def _admit_first(pipelines: str) -> str:
    """The shipped pipelines with every answer kept at once (`admit: first`)."""
    if "admit: second" not in pipelines:
        raise SystemExit("bench cache: no pipeline ships with `admit: second` any more")
    return pipelines.replace("admit: second", "admit: first")


def _costs(
    proxies: dict[str, tuple[str, int]], load: Callable[[str], Stats], rounds: int
) -> dict[str, Cost]:
    """Each proxy's medians over `rounds`, the first proxy's the baseline. The order turns
    every round (none always follows another), and the ratios are taken round by round,
    then their median: this machine drifts 20-30% over a minute, far less within a round."""
    names = list(proxies)
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for turn in range(rounds):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            url, pid = proxies[name]
            before = cpu_s(pid)[0]
            stats = load(url)
            seen[name].append((stats.rps, (cpu_s(pid)[0] - before) / stats.requests * 1000))
    base = seen[names[0]]
    return {
        name: Cost(
            rps=statistics.median(r for r, _ in runs),
            cpu_ms=statistics.median(c for _, c in runs),
            rps_ratio=statistics.median(r / b for (r, _), (b, _) in zip(runs, base, strict=True)),
            cpu_ratio=statistics.median(c / b for (_, c), (_, b) in zip(runs, base, strict=True)),
        )
        for name, runs in seen.items()
    }
