"""`python -m bench before`: this tree's proxy against an earlier commit's, timed side by side.

One shipped mesh; its proxy is this tree's, and a second proxy beside it runs commit `--rev`
(`git archive`, bench/traces.py's `earlier_tree`) with the same environment, calling the same
services. `digits` over REST at each `--concurrency`, in `--rounds` rounds that alternate
which proxy goes first; the figure is the median of each round's ratio (this tree / `--rev`).
Runs one after another on this machine drift by up to ~50% within minutes (bench/README,
2026-12-03): a change timed in separate runs can read as a 1.2-1.5x gain that side by side
is none. Both proxies here see the same drift. Two identical proxies still read a few percent
apart; `bench instructions` counts what timing cannot resolve.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import http_closed_loop, proxy_url, second_proxy, shipped_mesh
from bench.traces import earlier_tree

PATH = "/v1/pipelines/digits/infer"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench before", description=__doc__)
    parser.add_argument("--rev", default="HEAD", help="the earlier commit (default: HEAD)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args(argv)
    from sklearn.datasets import load_digits

    from samples.images import encode, render_digit

    blob = encode(render_digit(load_digits().images[0], scale=4))
    with shipped_mesh("bench-before-") as mesh:
        this = proxy_url(mesh)
        with (
            earlier_tree(args.rev) as tree,
            second_proxy(mesh.services["proxy"].env, tree) as earlier,
        ):
            proxies = {"this tree": this, args.rev: earlier}
            raw = post_bytes(this + PATH, blob, "image/png")
            print(f"| c | this tree req/s | {args.rev} req/s | throughput ratio (median) "
                  "| p50 ratio (median) | rounds' throughput ratios |")  # fmt: skip
            print("| --- | --- | --- | --- | --- | --- |")
            for c in args.concurrency:
                runs: dict[str, list[Stats]] = {name: [] for name in proxies}
                for round_ in range(args.rounds):
                    names = list(proxies) if round_ % 2 == 0 else list(reversed(proxies))
                    for name in names:
                        url = proxies[name] + PATH
                        stats = asyncio.run(http_closed_loop(url, [raw], c, args.duration))
                        if stats.errors:
                            raise SystemExit(f"{name}: {stats.errors} errors at c={c}")
                        runs[name].append(stats)
                new, old = runs["this tree"], runs[args.rev]
                rates = [n.rps / o.rps for n, o in zip(new, old, strict=True)]
                p50s = [n.p50_ms / o.p50_ms for n, o in zip(new, old, strict=True)]
                cells = [
                    f"{statistics.median(s.rps for s in new):,.0f}",
                    f"{statistics.median(s.rps for s in old):,.0f}",
                    f"**{statistics.median(rates):.3f}x**",
                    f"{statistics.median(p50s):.3f}x",
                    ", ".join(f"{r:.2f}" for r in rates),
                ]
                print(f"| {c} | " + " | ".join(cells) + " |", flush=True)
    return 0
