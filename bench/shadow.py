"""`python -m bench shadow`: what a shadow (`<VARIABLE>_SHADOW`, proxy/engine/shadows.py)
costs the live traffic of `digits`, measured in one run, rounds interleaved: three proxies of
the same kind over one shipped mesh, one without a shadow, one copying every call of the MLP
branch to a candidate (the logistic regression's server, as `digits_logreg`), one copying a
tenth of them. The copies are real calls on the same two cores: the cost to expect is the
candidate's share of the work, not more. Then the agreement the every-call proxy counted."""

from __future__ import annotations

import argparse
import asyncio

from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import HEADER, http_closed_loop, interleaved, row, second_proxy, shipped_mesh
from bench.services import metric_of

PATH = "/v1/pipelines/digits/infer"
SHADOWED = "PREDICTOR_DIGITS_MLP_URL_SHADOW"


def digits(count: int) -> list[bytes]:
    """The first `count` digits of scikit-learn's set, drawn as users' PNGs."""
    from sklearn.datasets import load_digits

    from samples.images import encode, render_digit

    return [encode(render_digit(values, scale=4)) for values in load_digits().images[:count]]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="what a shadow costs digits")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args(argv)
    blobs = digits(64)
    with shipped_mesh("bench-shadow") as mesh:
        env = mesh.services["proxy"].env
        candidate = f"127.0.0.1:{mesh.services['digits-logreg'].env['PREDICTOR_PORT']}"
        every = {**env, SHADOWED: f"{candidate}/digits_logreg"}
        with (
            second_proxy(env) as plain,
            second_proxy(every) as copied,
            second_proxy({**every, SHADOWED + "_PERCENT": "10"}) as tenth,
        ):

            def load(url: str, c: int) -> Stats:
                raw = [post_bytes(url + PATH, b, "image/png") for b in blobs]
                return asyncio.run(http_closed_loop(url, raw, c, args.duration))

            systems = {
                "no shadow": plain,
                "MLP branch shadowed, every call": copied,
                "MLP branch shadowed, 10%": tenth,
            }
            table = interleaved(systems, load, tuple(args.concurrency), args.rounds)
            counted = {
                f"{name} {outcome}": metric_of(copied, sample, step="ensemble/mlp", **labels)
                for name, sample, outcome, labels in [
                    ("copies", "proxy_shadow_calls_total", o, {"outcome": o})
                    for o in ("answered", "failed", "skipped")
                ]
                + [
                    ("label", "proxy_shadow_outputs_total", o, {"output": "label", "outcome": o})
                    for o in ("same", "differs")
                ]
            }
    print("\n### `digits` with a shadow of its MLP branch\n")
    print(HEADER)
    for c, stats in table.items():
        base = stats["no shadow"]
        for label, s in stats.items():
            print(row(label, c, s, base))
    print("\nCounted by the every-call proxy over the whole run:")
    for name, value in counted.items():
        print(f"- {name}: {value:,.0f}")
    return 0
