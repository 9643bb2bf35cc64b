"""`python -m bench jobs`: jobs on the shipped mesh, measured side by side in one run:

- drain: 500 OCR jobs drained by a proxy's workers (PROXY_JOBS_WORKERS=8), from the first
  submission to the last job ended, over 500 `/infer` calls of the same images at c=8; and
  the same with 2,000 digits jobs, where the queue's own cost per job is what shows;
- enqueue: POST .../jobs at c=32 (no worker running), its p99, and over the p99 of the same
  proxy's `/healthz` at c=32 right after (the closed loop's own tail on these cores);
- interactive first: `/infer` digits p99 at c=8 while a 1,000-job OCR backlog drains in the
  same proxy, over its p99 with no backlog.
Both backends (SQLite, and Redis with its append-only file)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx

from bench import redis_server
from bench.cache import digit, health_request, uploads
from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import http_closed_loop, median, second_proxy, shipped_mesh

GOALS = """Goals (issue 27): drain <= 1.15x the /infer time; enqueue p99 at c=32 <= 10 ms; \
/infer p99 with a backlog draining <= 2x without."""


def ocr_images(count: int) -> list[bytes]:
    from samples.text import suite

    lines = suite(25, seed=5, categories=["line_small", "line_medium"])
    return [lines[i % len(lines)].image for i in range(count)]


async def post_all(url: str, path: str, blobs: list[bytes], concurrency: int) -> None:
    """Every blob POSTed to `path`, `concurrency` at a time; any error stops the bench.
    aiohttp: httpx's client took ~5 ms a call here, more than a digits job costs."""
    limit = asyncio.Semaphore(concurrency)
    headers = {"Content-Type": "image/png"}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, timeout=timeout) as session:

        async def one(blob: bytes) -> None:
            async with limit, session.post(path, data=blob, headers=headers) as answer:
                answer.raise_for_status()
                await answer.read()

        await asyncio.gather(*(one(b) for b in blobs))


async def submit(
    url: str, blobs: list[bytes], concurrency: int = 32, pipeline: str = "ocr"
) -> None:
    await post_all(url, f"/v1/pipelines/{pipeline}/jobs", blobs, concurrency)


async def unfinished(client: httpx.AsyncClient) -> int:
    count = 0
    for status in ("queued", "running"):
        page = (await client.get("/v1/jobs", params={"status": status, "limit": "1"})).json()
        count += len(page["jobs"])
    return count


async def drain_s(url: str, blobs: list[bytes], pipeline: str = "ocr") -> float:
    started = time.perf_counter()
    await submit(url, blobs, pipeline=pipeline)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for _ in range(100_000):  # polled: the end is what is measured
            if not await unfinished(client):
                break
            await asyncio.sleep(0.05)
    return time.perf_counter() - started


async def infer_s(
    url: str, blobs: list[bytes], concurrency: int = 8, pipeline: str = "ocr"
) -> float:
    started = time.perf_counter()
    await post_all(url, f"/v1/pipelines/{pipeline}/infer", blobs, concurrency)
    return time.perf_counter() - started


@contextlib.contextmanager
def jobs_proxy(env: dict[str, str], backend: str, workers: int) -> Iterator[str]:
    """A proxy beside the mesh with a fresh jobs' store of `backend`."""
    folder = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    with contextlib.ExitStack() as stack:
        if backend == "redis":
            server = redis_server.start(folder / "redis", persistent=True)
            stack.callback(server.stop)
            queue = server.url
        else:
            queue = f"sqlite:///{folder / 'jobs.sqlite3'}"
        settings = {"PROXY_JOBS_URL": queue, "PROXY_JOBS_WORKERS": str(workers)}
        yield stack.enter_context(
            second_proxy({**env, **settings, "PROXY_JOBS_MAX_QUEUED": "100000"})
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="jobs: drain, enqueue, interactive first")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--digits", type=int, default=2000, help="digits jobs drained")
    parser.add_argument("--backends", default="sqlite,redis")
    args = parser.parse_args(argv)
    pages = ocr_images(args.jobs)
    backlog = ocr_images(1000)
    one_digit = digit()
    digits = uploads(one_digit, 0, args.digits)  # no two alike: a cache would not answer
    lines: list[str] = []
    with shipped_mesh("bench-jobs") as mesh:
        env = mesh.services["proxy"].env
        for backend in args.backends.split(","):
            drains, infers, enqueues, quiet, busy, healths = [], [], [], [], [], []
            digit_drains, digit_infers = [], []
            for _ in range(args.rounds):
                with jobs_proxy(env, backend, workers=8) as url:
                    asyncio.run(infer_s(url, pages[:16]))  # warm
                    infers.append(asyncio.run(infer_s(url, pages)))
                    drains.append(asyncio.run(drain_s(url, pages)))
                    digit_infers.append(asyncio.run(infer_s(url, digits, pipeline="digits")))
                    digit_drains.append(asyncio.run(drain_s(url, digits, "digits")))
                with jobs_proxy(env, backend, workers=0) as url:
                    raw = post_bytes(url + "/v1/pipelines/digits/jobs", one_digit, "image/png")
                    enqueues.append(
                        asyncio.run(http_closed_loop(url, raw, 32, args.duration, ok=(202,)))
                    )
                    # The same proxy doing nothing, right after: what a closed loop of 32 on
                    # these two cores has for a tail whatever it asks (the goal proposed).
                    idle = health_request(url)
                    healths.append(asyncio.run(http_closed_loop(url, idle, 32, args.duration)))
                with jobs_proxy(env, backend, workers=8) as url:
                    raw = post_bytes(url + "/v1/pipelines/digits/infer", one_digit, "image/png")
                    quiet.append(asyncio.run(http_closed_loop(url, raw, 8, args.duration)))
                    asyncio.run(submit(url, backlog))
                    busy.append(asyncio.run(http_closed_loop(url, raw, 8, args.duration)))
            drain, infer = sorted(drains)[len(drains) // 2], sorted(infers)[len(infers) // 2]
            d_drain = sorted(digit_drains)[len(digit_drains) // 2]
            d_infer = sorted(digit_infers)[len(digit_infers) // 2]
            enqueue: Stats = median(enqueues)
            health: Stats = median(healths)
            calm, loaded = median(quiet), median(busy)
            lines += [
                f"| {backend} | {args.jobs} OCR jobs drained | {drain:.1f} s | "
                f"{drain / infer:.2f}x {args.jobs} /infer at c=8 ({infer:.1f} s) |",
                f"| {backend} | {args.digits} digits jobs drained | {d_drain:.1f} s "
                f"({args.digits / d_drain:,.0f} jobs/s) | {d_drain / d_infer:.2f}x "
                f"{args.digits} /infer at c=8 ({d_infer:.1f} s) |",
                f"| {backend} | enqueue c=32 | p99 {enqueue.p99_ms:.2f} ms | "
                f"{enqueue.rps:,.0f} jobs/s, p50 {enqueue.p50_ms:.2f} ms, "
                f"{enqueue.errors} errors; {enqueue.p99_ms / health.p99_ms:.2f}x the p99 of "
                f"`/healthz` at c=32 ({health.p99_ms:.2f} ms, {health.rps:,.0f} req/s) |",
                f"| {backend} | /infer digits c=8, OCR backlog draining | "
                f"p99 {loaded.p99_ms:.2f} ms | {loaded.p99_ms / calm.p99_ms:.2f}x its p99 with "
                "no backlog "
                f"({calm.p99_ms:.2f} ms); {loaded.errors} errors |",
            ]
    print("\n### Jobs\n")
    print("| backend | what | measured | ratio |\n| --- | --- | --- | --- |")
    print("\n".join(lines))
    print(f"\n{GOALS}")
    return 0
