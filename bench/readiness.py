"""`python -m bench readiness`: what clients polling /readyz cost the mesh's normal traffic.
`digits` at concurrency 8 alone, then beside 8 clients polling /readyz in a loop, rounds
interleaved; reported as the ratio of the two throughputs (issue 24: eight pollers once
halved it, each poll a fan-out to every endpoint; now they share one fan-out per
PROXY_READY_CACHE_MS)."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from bench.httpload import Connection, post_bytes
from bench.loadgen import Stats
from bench.mesh import http_closed_loop, proxy_url, shipped_mesh


async def _with_pollers(
    url: str, raw: bytes, duration: float, pollers: int, interval: float, path: str
) -> tuple[Stats, int]:
    stop = asyncio.Event()
    polls = 0
    get = f"GET {path} HTTP/1.1\r\nHost: {url.split('//')[1]}\r\n\r\n".encode()

    async def poll() -> None:
        nonlocal polls
        conn = await Connection.open(url)
        try:
            while not stop.is_set():
                await conn.request(get)
                polls += 1
                if interval:
                    await asyncio.sleep(interval)
        finally:
            await conn.close()

    tasks = [asyncio.create_task(poll()) for _ in range(pollers)]
    try:
        stats = await http_closed_loop(url, raw, 8, duration)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return stats, polls


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="/readyz pollers against normal traffic")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pollers", type=int, default=8)
    parser.add_argument("--path", default="/readyz", help="what they poll (/healthz to compare)")
    parser.add_argument(
        "--interval",
        type=float,
        nargs="+",
        default=[0.1, 0.0],
        help="seconds each poller waits between polls (0: a tight loop); one row each",
    )
    args = parser.parse_args(argv)
    from samples.images import encode, render_digit

    digit = encode(render_digit(np.eye(8) * 16, scale=4))
    with shipped_mesh("bench-readiness-") as mesh:
        url = proxy_url(mesh)
        raw = post_bytes(url + "/v1/pipelines/digits/infer", digit, "image/png")
        for interval in args.interval:
            alone: list[float] = []
            beside: list[float] = []
            for _ in range(args.rounds):
                alone.append(asyncio.run(http_closed_loop(url, raw, 8, args.duration)).rps)
                stats, polls = asyncio.run(
                    _with_pollers(url, raw, args.duration, args.pollers, interval, args.path)
                )
                beside.append(stats.rps)
            a, b = float(np.median(alone)), float(np.median(beside))
            print(
                f"digits c=8 alone {a:,.0f} req/s; beside {args.pollers} {args.path} pollers "
                f"waiting {interval} s between polls ({polls / args.duration:,.0f} polls/s): "
                f"{b:,.0f} req/s, {b / a:.2f}x",
                flush=True,
            )
    return 0
