"""Jobs on the running mesh, through its faults, on both backends: 1,000 jobs (digits and
OCR mixed) drained by two worker processes (python -m proxy.job_worker) while each is
SIGKILLed once mid-drain and started again, and, on Redis, redis-server restarted once:
every accepted job reaches one final state, succeeded, with the answer /infer gives for the
same image. On SQLite, the proxy itself killed with jobs queued and running: all finish."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import httpx
import numpy as np
import pytest

from bench.mesh import free_port
from bench.redis_server import RedisServer
from samples.text import suite
from tests.callbacks import callbacks_received
from tests.conftest import TLS, Mesh, redis_or_skip
from tests.e2e.test_digits import held_out, png
from tests.procs import ROOT
from tests.report import report

FINAL = {"succeeded", "failed", "cancelled"}
LEASE_S = "4"
"""Short, so that a killed worker's jobs are taken again soon; longer than a Redis restart
(~1 s), which would otherwise end every lease it outlasts (an attempt more each)."""
ATTEMPTS = "4"
"""One more than the faults a job may meet here (two kills, a restart): the test shows
nothing is lost, so no job may run out of attempts."""


@contextmanager
def process(mesh: Mesh, module: str, **env: str) -> Iterator[subprocess.Popen]:
    """`python -m <module>` with the mesh proxy's environment changed by `env`, once its
    /healthz answers; killed on exit."""
    full = {**os.environ, **mesh.local.services["proxy"].env, "PROXY_GRPC_PORT": "off", **env}
    # Its log kept, so that a process that does not start says why.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module], cwd=ROOT, env=full,
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        try:
            try:
                wait_live(f"http://127.0.0.1:{env['PROXY_PORT']}", proc)
            except AssertionError:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-3000:]
                message = f"{module} not live (exit {proc.poll()}); its log:\n{tail}"
                raise AssertionError(message) from None
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


@contextmanager
def job_store(backend: str, folder: Path) -> Iterator[tuple[RedisServer | None, str]]:
    """The jobs' store of `backend` in `folder`, and PROXY_JOBS_URL for it: a redis-server with
    its append-only file (stopped on exit), or `folder`/jobs.sqlite3."""
    redis = redis_or_skip(folder / "redis", persistent=True) if backend == "redis" else None
    try:
        yield redis, redis.url if redis else f"sqlite:///{folder / 'jobs.sqlite3'}"
    finally:
        if redis is not None:
            redis.stop()


def wait_live(url: str, proc: subprocess.Popen) -> None:
    until = time.monotonic() + 60
    with httpx.Client(timeout=2, verify=TLS) as client:
        while True:
            try:
                if client.get(url + "/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < until and proc.poll() is None, "not live"
            time.sleep(0.1)


@functools.cache
def inputs() -> list[tuple[str, bytes]]:
    """900 digits (the held-out images) and 100 OCR images (text lines of every size)."""
    images, _ = held_out()
    digits = [("digits", png(images[i % len(images)])) for i in range(900)]
    pages = suite(10, seed=3, categories=["line_small", "line_medium", "line_large"])
    ocr = [("ocr", pages[i % len(pages)].image) for i in range(100)]
    mixed = digits + ocr
    np.random.default_rng(0).shuffle(mixed)  # type: ignore[arg-type]
    return mixed


async def submit_all(
    url: str, work: list[tuple[str, bytes]], params: dict[str, str] | None = None
) -> list[str]:
    limit = asyncio.Semaphore(32)
    headers = {"Content-Type": "image/png"}
    async with aiohttp.ClientSession(url) as session:

        async def one(pipeline: str, blob: bytes) -> str:
            async with (
                limit,
                session.post(
                    f"/v1/pipelines/{pipeline}/jobs", data=blob, headers=headers, params=params
                ) as answer,
            ):
                assert answer.status == 202, await answer.text()
                return (await answer.json())["id"]

        return await asyncio.gather(*(one(p, b) for p, b in work))


def statuses(url: str, ids: list[str]) -> dict[str, dict]:
    """Every job of `ids` as GET /v1/jobs lists it, a page of 1,000 at a time (one GET a
    job took ~10 s of the suite for 1,000)."""
    found: dict[str, dict] = {}
    with httpx.Client(base_url=url, timeout=30, verify=TLS) as client:
        cursor: str | None = None
        while True:
            params = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
            page = client.get("/v1/jobs", params=params)
            assert page.status_code == 200, page.text
            found.update((job["id"], job) for job in page.json()["jobs"])
            cursor = page.json()["next"]
            if cursor is None:
                break
    assert set(ids) <= set(found), f"{len(set(ids) - set(found))} jobs not listed"
    return {i: found[i] for i in ids}


def final_count(client: httpx.Client) -> int:
    """Jobs ended so far (0 while the store restarts: the door answers 503 then)."""
    count = 0
    for status in FINAL:
        page = client.get("/v1/jobs", params={"status": status, "limit": "1000"})
        if page.status_code != 200:
            assert page.status_code == 503, page.text
            return 0
        count += len(page.json()["jobs"])
    return count


_ANSWERS: dict[bytes, object] = {}
"""What /infer answered for each input (the same inputs and mesh in every test here)."""


def expected(mesh: Mesh, work: list[tuple[str, bytes]]) -> dict[bytes, object]:
    """What /infer answers for each distinct input."""
    wanted = {blob: pipeline for pipeline, blob in work if blob not in _ANSWERS}

    def ask(client: httpx.Client, blob: bytes) -> None:
        r = client.post(
            f"/v1/pipelines/{wanted[blob]}/infer",
            content=blob,
            headers={"Content-Type": "image/png"},
        )
        assert r.status_code == 200, r.text
        _ANSWERS[blob] = r.json()["result"]

    with mesh.client() as client, ThreadPoolExecutor(8) as pool:
        list(pool.map(functools.partial(ask, client), wanted))
    return _ANSWERS


def check(mesh: Mesh, url: str, work: list[tuple[str, bytes]], ids: list[str]) -> Counter:
    jobs = statuses(url, ids)
    states = Counter(j["status"] for j in jobs.values())
    failed = [(j["attempts"], j.get("error")) for j in jobs.values() if j["status"] != "succeeded"]
    assert states == {"succeeded": len(ids)}, (states, failed[:3])
    want = expected(mesh, work)
    for (_, blob), job_id in zip(work, ids, strict=True):
        got = jobs[job_id]["result"]["result"]
        if "lines" in got:
            assert [line["text"] for line in got["lines"]] == [
                line["text"]
                for line in want[blob]["lines"]  # type: ignore[index]
            ]
        else:
            assert got["label"] == want[blob]["label"]  # type: ignore[index]
            np.testing.assert_allclose(
                got["probabilities"],
                want[blob]["probabilities"],
                atol=1e-6,  # type: ignore[index]
            )
    return Counter(j["attempts"] for j in jobs.values())


def drain(url: str, total: int, events: dict[int, object], timeout_s: float = 300) -> None:
    """Wait until `total` jobs ended, running each of `events` (finished count -> action)
    once that many have."""
    until = time.monotonic() + timeout_s
    pending = dict(sorted(events.items()))
    # Each look lists every ended job (up to 1,000 with their results): once a second, so
    # that looking does not take the workers' CPU.
    with httpx.Client(base_url=url, timeout=30, verify=TLS) as client:
        while True:
            done = final_count(client)
            for at in [a for a in pending if done >= a]:
                pending.pop(at)()  # type: ignore[operator]
            if done >= total:
                return
            assert time.monotonic() < until, f"{done} of {total} ended"
            time.sleep(1.0)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_workers_killed_and_redis_restarted_lose_nothing(
    mesh: Mesh, tmp_path: Path, backend: str
) -> None:
    with job_store(backend, tmp_path) as (redis, queue):
        common = {
            "PROXY_JOBS_URL": queue,
            "PROXY_JOBS_LEASE_S": LEASE_S,
            "PROXY_JOBS_ATTEMPTS": ATTEMPTS,
        }
        work = inputs()
        door_port, ports = free_port(), [free_port(), free_port()]
        with process(mesh, "proxy", PROXY_PORT=str(door_port), PROXY_JOBS_WORKERS="0", **common):
            url = f"http://127.0.0.1:{door_port}"
            ids = asyncio.run(submit_all(url, work))
            workers: list[subprocess.Popen] = []
            env = {**common, "PROXY_JOBS_WORKERS": "8"}

            def start(i: int) -> None:
                cm = process(mesh, "proxy.job_worker", PROXY_PORT=str(ports[i]), **env)
                workers.append(cm.__enter__())
                cleanups.append(cm)

            def kill(i: int) -> callable:
                def action() -> None:
                    victim = workers[i]
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(10)
                    start(i)
                    workers[i] = workers.pop()

                return action

            cleanups: list = []
            start(0)
            start(1)
            events = {150: kill(0), 600: kill(1)}
            if redis is not None:
                events[400] = redis.restart
            try:
                drain(url, len(ids), events)
            finally:
                for cm in cleanups:
                    cm.__exit__(None, None, None)
            attempts = check(mesh, url, work, ids)
    report(
        f"jobs ({backend}): 1000 of 1000 succeeded through two worker kills"
        f"{' and a Redis restart' if redis else ''}; attempts {dict(sorted(attempts.items()))}"
    )
    assert len(set(ids)) == len(ids) == 1000


def test_a_killed_proxy_finishes_its_jobs_and_their_callbacks_after_a_restart(
    mesh: Mesh, tmp_path: Path
) -> None:
    """Killed with jobs running, and with callbacks of ended jobs still to go (the receiver
    refusing them until then): the next proxy runs the jobs again and sends every callback,
    once. The callbacks were lost with the process before the outbox."""
    queue = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    env = {"PROXY_JOBS_URL": queue, "PROXY_JOBS_LEASE_S": LEASE_S, "PROXY_JOBS_WORKERS": "4"}
    work = inputs()[:300]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    refusing = threading.Event()
    refusing.set()
    with callbacks_received(refusing=refusing) as hook:
        env["PROXY_JOBS_CALLBACK_HOSTS"] = hook.host
        env["PROXY_JOBS_CALLBACK_HOLD_S"] = "2"
        with process(mesh, "proxy", PROXY_PORT=str(port), **env) as proxy:
            ids = asyncio.run(submit_all(url, work, {"callback": hook.url}))
            with httpx.Client(base_url=url, timeout=30, verify=TLS) as client:
                while final_count(client) < 20:  # some ended, some running, most queued
                    time.sleep(0.05)
            proxy.send_signal(signal.SIGKILL)
            proxy.wait(10)
        with process(mesh, "proxy", PROXY_PORT=str(port), **env):
            # Refusing until the dead proxy's last tries are answered: one still in the
            # receiver's hands when it stopped refusing was taken (204 to a dead sender), and
            # rightly sent again by the next proxy, never having been told (2 of 300 on CI).
            while hook.at_once:
                time.sleep(0.01)
            refusing.clear()
            drain(url, len(ids), {})
            attempts = check(mesh, url, work, ids)
            until = time.monotonic() + 60
            while len(hook.taken) < len(ids) and time.monotonic() < until:
                time.sleep(0.1)
            time.sleep(3)  # a callback sent twice would show by now (the hold is 2 s)
    report(
        f"jobs (sqlite): a killed proxy's 300 jobs all succeeded; attempts {dict(attempts)}; "
        f"{sum(hook.taken.values())} callbacks for them ({len(hook.bodies)} tries)"
    )
    assert attempts[2] >= 1  # the jobs it was running when killed ran again
    assert hook.taken == Counter({(i, "succeeded"): 1 for i in ids})
