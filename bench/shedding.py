"""`python -m bench shedding`: answers in time when clients' budgets are shorter than the wait,
with requests refused at once for their budget (PROXY_SHED_LATE, proxy/engine/pace.py) and
without. Two proxies beside one shipped mesh, rounds interleaved: OCR pages from
samples/text.py by clients with a budget (`X-Request-Timeout-Ms`), and `digits` without one,
to show what the bookkeeping costs where nothing is refused. Each row: answers (200) a
second on each proxy and their ratio. `--polite`: the OCR clients wait the `Retry-After`
they are told, as a well-behaved client (or `mesh batch`) does."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import http_closed_loop, median, second_proxy, shipped_mesh
from bench.services import metric_of
from samples import text
from samples.images import encode, render_digit

CATEGORIES = ["page", "everything", "photo", "line_large"]
"""Full pages and single lines: what a crowd of OCR users sends."""


def _ocr(url: str, budget_ms: int) -> list[bytes]:
    pages = text.suite(3, seed=11, categories=CATEGORIES)
    headers = {"X-Request-Timeout-Ms": str(budget_ms)}
    path = f"{url}/v1/pipelines/ocr/infer"
    return [post_bytes(path, s.image, "image/png", headers) for s in pages]


def _digits(url: str) -> list[bytes]:
    rng = np.random.default_rng(5)
    path = f"{url}/v1/pipelines/digits/infer"
    images = [encode(render_digit(rng.integers(0, 17, (8, 8)).astype(float))) for _ in range(64)]
    return [post_bytes(path, image, "image/png") for image in images]


def _refused(url: str) -> float:
    """Requests the proxy at `url` refused for their budget so far: told apart from those
    answered late. Read after the run, so it may count a refusal the client no longer
    waited for as the run ended."""
    return metric_of(url, "proxy_requests_shed_total")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="answers in time with and without shedding")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget-ms", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument(
        "--polite",
        action="store_true",
        help="OCR clients wait the Retry-After they are told (else they send again at once)",
    )
    args = parser.parse_args(argv)
    with shipped_mesh("bench-shedding-") as mesh:
        env = dict(mesh.services["proxy"].env)
        with (
            second_proxy({**env, "PROXY_SHED_LATE": "true"}) as on,
            second_proxy({**env, "PROXY_SHED_LATE": "false"}) as off,
        ):
            polite = ", polite" if args.polite else ""
            cases = [
                (f"ocr c={c}, {args.budget_ms} ms budgets{polite}", c, _ocr)
                for c in args.concurrency
            ]
            cases.append(("digits c=32, no budget", 32, None))
            runs: dict[tuple[str, str], list[Stats]] = {}
            for r in range(args.rounds):
                for label, c, make in cases:
                    for name, url in (("on", on), ("off", off)):
                        raw = make(url, args.budget_ms) if make else _digits(url)
                        before = _refused(url)
                        waits = args.polite and make is not None
                        stats = asyncio.run(
                            http_closed_loop(url, raw, c, args.duration, polite=waits)
                        )
                        refused = _refused(url) - before
                        runs.setdefault((label, name), []).append(stats)
                        print(
                            f"round {r} {label:<28} shedding {name:<3} "
                            f"{stats.rps:8.1f} answers/s, {stats.errors} not "
                            f"(refused at once: {refused:.0f})",
                            flush=True,
                        )
            print("\n| case | shedding on, answers/s | off | on / off |\n| --- | --- | --- | --- |")
            for label, _c, _make in cases:
                a, b = median(runs[(label, "on")]), median(runs[(label, "off")])
                ratio = a.rps / b.rps if b.rps else float("inf")
                print(f"| {label} | {a.rps:.1f} | {b.rps:.1f} | {ratio:.2f}x |")
    return 0
