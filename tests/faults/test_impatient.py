"""Impatient clients (budgets of a few milliseconds) and clients that hang up, at once, for a
while: afterwards every digits pipeline answers as before, on every path the proxy has
(streams with merged calls, streams alone, unary calls). A merged-call lane once wedged for
good under this load: every later request answered 504 after its whole budget."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from samples.images import encode, render_digit
from tests.conftest import Mesh
from tests.faults.load import hang_ups, impatient, run
from tests.report import report

pytestmark = pytest.mark.alone  # how the mesh holds under load: no other test beside it

BODY = encode(render_digit(np.eye(8) * 16))
PATHS = {
    "streams+merged": ({}, 30.0),
    "streams": ({"PROXY_MERGE": "false"}, 8.0),
    "unary": ({"PROXY_TRANSPORT": "unary", "PROXY_MERGE": "false"}, 8.0),
}
"""The proxy's settings, and how long the impatient load lasts: on the default path the 30 s
issue 24 asks for (its lanes wedged within 8 s of such a load, and after 3.3 s of hang-ups
alone); on the other two paths 8 s, to keep the suite's time."""


@contextmanager
def _proxy(mesh: Mesh, env: dict[str, str]) -> Iterator[str]:
    if not env:
        yield mesh.url
    else:
        with mesh.extra_proxy(27480, **env) as url:
            yield url


async def _storm(url: str, duration_s: float):
    infer = "/v1/pipelines/{}/infer"
    return await asyncio.gather(
        impatient(url, infer.format("digits"), BODY, clients=12, duration_s=duration_s),
        impatient(url, infer.format("digits-partial"), BODY, clients=4, duration_s=duration_s),
        hang_ups(url, infer.format("digits"), BODY, clients=3, duration_s=duration_s),
        hang_ups(url, infer.format("digits-partial"), BODY, clients=1, duration_s=duration_s),
    )


def _caught_up(url: str) -> float:
    """Seconds until a request sent now is answered (200)."""
    start = time.monotonic()
    answer = httpx.post(
        f"{url}/v1/pipelines/digits/infer",
        content=BODY,
        headers={"Content-Type": "image/png", "X-Request-Timeout-Ms": "20000"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return time.monotonic() - start


@pytest.mark.parametrize("path", list(PATHS))
def test_impatient_and_departing_clients_leave_the_mesh_answering(mesh: Mesh, path: str) -> None:
    env, duration = PATHS[path]
    with _proxy(mesh, env) as url:
        strict, partial, gone, gone_partial = asyncio.run(_storm(url, duration))
        for name, tally in (("digits", strict), ("digits-partial", partial)):
            report(tally.summary(f"impatient clients, {path}, {duration:.0f} s, {name}"))
            assert tally.lost == 0 and tally.hung == 0
            assert set(tally.by_status) <= {200, 503, 504}, (tally.by_status, tally.bodies)
            # A 503 only as a refusal for the budget (shedding, engine/room.py): where the
            # machine is slow enough that a request costs the pipeline over 10 ms of its time
            # and none is answered within these budgets, some are refused at once (6 of
            # 3,450 in one CI run beside the other worker's tests). A stream closed under
            # its neighbours, or a wedged lane, would be a 503 of another kind.
            for body in tally.bodies.get(503, []):
                assert b"would not answer within the request's budget" in body, body
            assert tally.by_status[504] > 0, "the budgets were meant to run out"
        report(f"clients that hung up, {path}: {gone + gone_partial}")
        assert gone > 100
        # The hang-ups came faster than two cores answer them beside the impatient load:
        # the proxy is still reading the last second or two of them from its listening
        # socket when the storm ends. One request with a long budget waits that out (the
        # proxy takes connections in order); a wedged lane would still answer it 504.
        caught_up = _caught_up(url)
        report(f"after the impatient clients, {path}: caught up in {caught_up:.2f} s")
        # Afterwards: normal clients get normal answers, right and in time.
        for pipeline in ("digits", "digits-partial"):
            after = asyncio.run(
                run(
                    url,
                    f"/v1/pipelines/{pipeline}/infer",
                    BODY,
                    requests=200,
                    concurrency=8,
                    timeout_ms=2000,
                )
            )
            report(after.summary(f"after the impatient clients, {path}, {pipeline}"))
            assert after.by_status == {200: after.sent}, after.by_status
            assert max(after.latencies) < 1.0
            answer = httpx.post(
                f"{url}/v1/pipelines/{pipeline}/infer",
                content=BODY,
                headers={"Content-Type": "image/png"},
                timeout=10,
            )
            assert answer.status_code == 200 and answer.json()["partial"] is False, answer.text
            assert answer.json()["result"]["label"] == 1
