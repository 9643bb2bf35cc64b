"""The jobs' store stalls, not dies: Redis frozen (SIGSTOP) longer than the proxy's socket
timeout, or the SQLite file write-locked by another process (a backup, a shell) longer than
its busy timeout, while clients submit with Idempotency-Keys and the workers drain. Every
key names one job, every job ends once with /infer's answer, and /infer answers throughout."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import aiohttp
import httpx
import pytest

from bench.mesh import free_port
from tests.callbacks import callbacks_received
from tests.conftest import TLS, Mesh
from tests.e2e.test_digits import held_out, png
from tests.e2e.test_jobs import check, drain, job_store, process
from tests.report import report

STALL_S = 12.0
"""Longer than the Redis client's socket timeout and SQLite's busy timeout (10 s each): the
proxy's calls to the store fail, not only wait."""


async def submit_keyed(
    url: str, work: list[tuple[str, bytes]], first: int, refused: list[int], callback: str
) -> list[str]:
    """Each input submitted under a key of its own, with a callback, sent again with the same
    key after a 503 (or a connection lost) as a careful client does, until it is accepted."""
    limit = asyncio.Semaphore(16)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(url, timeout=timeout) as session:

        async def one(i: int, blob: bytes) -> str:
            headers = {"Content-Type": "image/png", "Idempotency-Key": f"scan-{i}"}
            until = time.monotonic() + 90
            async with limit:
                while True:
                    try:
                        async with session.post(
                            "/v1/pipelines/digits/jobs",
                            data=blob,
                            headers=headers,
                            params={"callback": callback},
                        ) as answer:
                            if answer.status == 202:
                                return (await answer.json())["id"]
                            assert answer.status == 503, await answer.text()
                            assert answer.headers["Retry-After"]
                            refused.append(answer.status)
                    except (aiohttp.ClientError, TimeoutError):
                        refused.append(0)
                    assert time.monotonic() < until, f"input {i} never accepted"
                    await asyncio.sleep(0.5)

        return await asyncio.gather(*(one(i, blob) for i, (_, blob) in enumerate(work, first)))


@contextmanager
def redis_frozen(pid: int) -> AbstractContextManager[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextmanager
def sqlite_locked(path: Path) -> AbstractContextManager[None]:
    """Another process's write lock, as `sqlite3 jobs.sqlite3 'BEGIN EXCLUSIVE'` holds it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


def during(url: str, stall: Callable[[], AbstractContextManager[None]], seen: list) -> None:
    """`/infer` every 0.2 s for as long as the store stalls."""
    image = png(held_out()[0][0])
    with httpx.Client(base_url=url, timeout=5, verify=TLS) as client, stall():
        end = time.monotonic() + STALL_S
        while time.monotonic() < end:
            try:
                answer = client.post(
                    "/v1/pipelines/digits/infer", content=image,
                    headers={"Content-Type": "image/png"},
                )  # fmt: skip
                seen.append(answer.status_code)
            except httpx.HTTPError as exc:  # e.g. no answer within 5 s
                seen.append(repr(exc))
            time.sleep(0.2)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_stalled_store_loses_and_doubles_nothing(
    mesh: Mesh, tmp_path: Path, backend: str
) -> None:
    path = tmp_path / "jobs.sqlite3"  # job_store's SQLite file
    images, _ = held_out()
    work = [("digits", png(images[i % len(images)])) for i in range(300)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    refused: list[int] = []
    answered: list[int | str] = []
    with job_store(backend, tmp_path) as (redis, queue), callbacks_received() as hook:
        env = {"PROXY_PORT": str(port), "PROXY_JOBS_URL": queue, "PROXY_JOBS_WORKERS": "8"}
        env["PROXY_JOBS_CALLBACK_HOSTS"] = hook.host
        with process(mesh, "proxy", **env):
            # the workers start
            ids = asyncio.run(submit_keyed(url, work[:100], 0, refused, hook.url))
            stall = (lambda: redis_frozen(redis.process.pid)) if redis else (
                lambda: sqlite_locked(path)
            )  # fmt: skip
            meanwhile = threading.Thread(target=during, args=(url, stall, answered))
            meanwhile.start()
            time.sleep(0.2)
            started = time.monotonic()
            ids += asyncio.run(submit_keyed(url, work[100:], 100, refused, hook.url))
            submitting_s = time.monotonic() - started
            meanwhile.join()
            drain(url, len(work), {})
            print("drained", time.monotonic() - started, flush=True)
            attempts = check(mesh, url, work, ids)
            with httpx.Client(base_url=url, timeout=30, verify=TLS) as client:
                listed = client.get("/v1/jobs", params={"limit": "1000"}).json()["jobs"]
            until = time.monotonic() + 30  # a callback goes once its job's end is written
            while len(hook.taken) < len(ids) and time.monotonic() < until:
                time.sleep(0.2)
    # Every job's end hook.taken back, even one whose final write the store took but could not
    # acknowledge within the stall (a retry of it was refused: the job was no longer running).
    assert set(hook.taken) == {(job_id, "succeeded") for job_id in ids}, len(hook.taken)
    assert set(hook.taken.values()) == {1}  # each once: every outcome written within the stall
    assert len(set(ids)) == len(ids) == len(listed) == 300  # one job a key, none more
    assert submitting_s > STALL_S / 2, "the submissions did not wait: the store did not stall"
    assert answered and set(answered) == {200}
    report(
        f"jobs ({backend}) through a {STALL_S:g} s stall of the store: 300 of 300 succeeded, "
        f"{len(refused)} submissions refused and sent again, {len(answered)} of "
        f"{len(answered)} /infer calls answered, {sum(hook.taken.values())} callbacks for 300 "
        f"jobs; "
        f"attempts {dict(sorted(attempts.items()))}"
    )
