"""`python -m bench foreign`: the `digits` ensemble with a foreign fourth branch, beside the
all-ours ensemble, in one run (rounds interleaved): MLServer and KServe's model server
(bench/foreign/, from their own venvs made by `./mesh test` or `./mesh bench foreign`) each
serve the digits MLP, our ONNX file in their runtime, under the name `digits`; a second
proxy on the shipped mesh's services adds it as `PREDICTOR_DIGITS_FOREIGN_URL`, on the
default transport; and a third proxy the same, told the rows the foreign model takes
(`PREDICTOR_DIGITS_FOREIGN_URL_MAX_BATCH_SIZE`, which neither server can report), so that it
merges concurrent requests' calls to it. Reported: the share of requests answered 200 and
the throughput, each against the all-ours ensemble's (three branches, the mesh's own
proxy)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.foreign import servers
from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import http_closed_loop, proxy_url, second_proxy, shipped_mesh

DECLARED_BATCH = 64
"""The rows a call that the `batch declared` rows tell the proxy the foreign model takes."""


@contextlib.contextmanager
def branch_proxy(
    env: dict[str, str], foreign: servers.Foreign, declared_batch: int | None = None
) -> Iterator[str]:
    """A second proxy on the mesh's services, with the foreign server as a fourth branch
    (`declared_batch`: its PREDICTOR_DIGITS_FOREIGN_URL_MAX_BATCH_SIZE, so that the proxy
    merges calls to it)."""
    variable = "PREDICTOR_DIGITS_FOREIGN_URL"
    extra = {} if declared_batch is None else {f"{variable}_MAX_BATCH_SIZE": str(declared_batch)}
    with second_proxy({**env, variable: f"{foreign.address}/{servers.NAME}", **extra}) as url:
        yield url


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="a foreign branch beside the all-ours ensemble")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args(argv)
    if missing := [k for k in servers.VENVS if not servers.available(k)]:
        print(f"missing venvs for {missing}: run ./mesh bench foreign (it makes them)")
        return 2
    with shipped_mesh("bench-foreign-mesh-") as mesh:
        print(table(mesh, args.concurrency, args.rounds, args.duration))
    return 0


def table(mesh, concurrency: list[int], rounds: int, duration: float) -> str:
    """The comparison on a running shipped mesh (also the end of `bench pipelines`)."""
    from samples.images import encode, render_digit

    digit = encode(render_digit(np.eye(8) * 16, scale=4))
    workdir = Path(tempfile.mkdtemp(prefix="bench-foreign-"))
    with contextlib.ExitStack() as stack:
        env = mesh.services["proxy"].env
        urls = {"all ours (3 branches)": proxy_url(mesh)}
        for kind in servers.VENVS:
            server = servers.start(kind, workdir / kind, servers.NAME, servers.ONNX)
            stack.callback(server.stop)
            urls[f"+ {kind} branch"] = stack.enter_context(branch_proxy(env, server))
            urls[f"+ {kind} branch, batch declared"] = stack.enter_context(
                branch_proxy(env, server, DECLARED_BATCH)
            )
        path = "/v1/pipelines/digits/infer"
        runs: dict[tuple[str, int], list[Stats]] = {}
        for _ in range(rounds):
            for c in concurrency:
                for label, url in urls.items():
                    raw = post_bytes(url + path, digit, "image/png")
                    stats = asyncio.run(http_closed_loop(url, raw, c, duration))
                    runs.setdefault((label, c), []).append(stats)
    lines = [
        "| system | concurrency | answered | req/s | vs all ours | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in concurrency:
        base = _median(runs[("all ours (3 branches)", c)])
        for label in urls:
            s = _median(runs[(label, c)])
            total = sum(r.requests + r.errors for r in runs[(label, c)])
            ok = sum(r.requests for r in runs[(label, c)])
            lines.append(
                f"| {label} | {c} | {ok / total:.1%} of {total} | {s.rps:,.1f} | "
                f"{s.rps / base.rps:.2f}x | {s.p50_ms:.2f} | {s.p99_ms:.2f} |"
            )
    return "\n".join(lines)


def _median(stats: list[Stats]) -> Stats:
    return sorted(stats, key=lambda s: s.rps)[len(stats) // 2]
