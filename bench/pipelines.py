"""`python -m bench pipelines`: the shipped digits and ocr pipelines through the whole mesh
(REST, every service a process) against, in the same run with rounds interleaved (drift
hits every system alike; each row is the median round by throughput):
- the same steps in one process (the limit);
- the same topology with nothing in it (bench/hops.py: the hops alone);
- the mesh's old path: a second proxy on the same services with unary calls and no merging;
- digits: the design the project started from (bench/reference.py: FastAPI + httpx, JSON in),
  and the mesh on that design's own work: `digits-features` (the same 64 features as JSON,
  the same three classifiers at once, no image and no preprocessing hop);
- ocr: the reference library (rapidocr-onnxruntime on the same three models);
- the same pipeline called as a v2 model at the proxy's gRPC door by perf_analyzer (Triton's
  C++ load generator), by unary calls and on streams, when it can run here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from bench import perf_analyzer
from bench.httpload import post_bytes
from bench.inprocess import InProcess
from bench.loadgen import Stats, run_threads
from bench.mesh import (
    HEADER,
    ROOT,
    cycle,
    http_closed_loop,
    median,
    proxy_url,
    row,
    second_proxy,
    shipped_mesh,
)

REPOSITORY = ROOT / "models" / "repository"

OLD_PATH = {"PROXY_TRANSPORT": "unary", "PROXY_MERGE": "false"}
"""The proxy's settings for the path before streams and caller-side batching."""

GOALS = """Goals (issue 15), mesh against the reference design: p50 at c=1 <= 0.8x; \
throughput at c=8 >= 3x; at c=32 >= 6x with p99 <= 1/8."""


@contextlib.contextmanager
def old_path_proxy(env: dict[str, str]) -> Iterator[str]:
    """A second proxy beside the mesh's, on the same services, calling them the old way:
    both paths measured in one run. Yields its URL."""
    with second_proxy({**env, **OLD_PATH}) as url:
        yield url


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the shipped pipelines against their baselines")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--ocr-duration", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (digits)")
    parser.add_argument("--ocr-rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--ocr-concurrency",
        type=int,
        nargs="+",
        default=[1, 8, 32],
        help="an OCR request takes ~1 s of both cores, so at concurrency c each waits ~c s: "
        "above 8 the window grows to --ocr-duration * c / 8 (every request carries a 60 s "
        "budget, X-Request-Timeout-Ms, so saturation shows as throughput, not as 504s)",
    )
    parser.add_argument("--pipelines", nargs="+", default=["digits", "ocr"])
    parser.add_argument(
        "--ocr-images-per-category",
        type=int,
        default=2,
        help="images of each category of the generated text suite, sent in turn",
    )
    args = parser.parse_args(argv)
    from bench.hops import NullMesh
    from bench.reference import reference_digits
    from proxy.settings import DEFAULT_PIPELINES
    from samples.images import encode, render_digit
    from samples.text import suite

    with shipped_mesh("bench-mesh-") as mesh:
        services, url = mesh.services, proxy_url(mesh)
        from sklearn.datasets import load_digits

        image = load_digits().images[0]
        digit = encode(render_digit(image, scale=4))
        features = (image.reshape(-1)).tolist()
        # The same generated images (every category of the text suite) for every system.
        pages = [s.image for s in suite(args.ocr_images_per_category, seed=1)]
        local = InProcess(threads=1)
        lines: list[str] = []
        pipelines = Path(services["proxy"].env.get("PROXY_PIPELINES", DEFAULT_PIPELINES))
        budget = {"X-Request-Timeout-Ms": "60000"}
        door = f"127.0.0.1:{services['proxy'].env['PROXY_GRPC_PORT']}"
        rest = f"127.0.0.1:{services['proxy'].env['PROXY_PORT']}"
        try:
            pa_env: dict[str, str] | None = perf_analyzer.environment()
        except perf_analyzer.Unavailable as exc:
            print(f"perf_analyzer rows left out: {exc}")
            pa_env = None
        for name in args.pipelines:
            ocr = name == "ocr"
            blobs = pages if ocr else [digit]
            rounds = args.ocr_rounds if ocr else args.rounds
            print(f"\n### `{name}`: whole mesh over REST against its baselines\n")
            if ocr:
                print(
                    f"{len(blobs)} images, {args.ocr_images_per_category} per category of "
                    "the generated text suite, sent in turn to every system.\n"
                )
            print(HEADER)
            with contextlib.ExitStack() as stack:
                null = stack.enter_context(NullMesh(pipelines, name, services["proxy"].env))
                old_url = stack.enter_context(old_path_proxy(services["proxy"].env))
                path = f"/v1/pipelines/{name}/infer"
                loads = {
                    HOPS: (null.url, [post_bytes(null.url, b, "image/png") for b in blobs]),
                    OLD: (
                        old_url,
                        [post_bytes(old_url + path, b, "image/png", budget) for b in blobs],
                    ),
                    MESH: (url, [post_bytes(url + path, b, "image/png", budget) for b in blobs]),
                }
                if not ocr:
                    ref = stack.enter_context(reference_digits(REPOSITORY, 18300))
                    loads[REFERENCE] = (ref, [_json_post(f"{ref}/predict", {"features": features})])
                    same_work = f"{url}/v1/pipelines/digits-features/infer"
                    loads[SAME_WORK] = (url, [_json_post(same_work, {"features": [features]})])
                for c in args.ocr_concurrency if ocr else args.concurrency:
                    window = (args.ocr_duration * max(1.0, c / 8)) if ocr else args.duration
                    stats = _measure(
                        local.ocr if ocr else local.digits,
                        blobs,
                        loads,
                        c,
                        window,
                        rounds,
                        with_library=ocr and c <= 8,
                        door=_door(door, rest, name, blobs, pa_env) if pa_env else None,
                    )
                    base = stats["in-process"]
                    for label, s in stats.items():
                        print(row(label, c, s, base), flush=True)
                    lines.extend(_summary(name, c, stats))
        print("\n" + "\n".join(lines))
        if "digits" in args.pipelines:
            print("\n" + GOALS)
            _foreign_branch(mesh, args)
    return 0


def _foreign_branch(mesh, args: argparse.Namespace) -> None:
    """`digits` with a foreign fourth branch beside the all-ours ensemble (bench/swapin.py),
    where the foreign servers' venvs exist."""
    from bench import swapin
    from bench.foreign import servers

    print("\n### `digits` with a foreign branch (MLServer, KServe), default transport\n")
    if missing := [k for k in servers.VENVS if not servers.available(k)]:
        print(f"left out: no venv for {missing} (./mesh bench foreign makes them)")
        return
    concurrency = [c for c in args.concurrency if c <= 8] or args.concurrency[:1]
    print(swapin.table(mesh, concurrency, max(1, args.rounds - 1), args.duration))


HOPS = "hops only (same topology, echo services)"
DOOR = "mesh, gRPC door (perf_analyzer, C++ client)"
DOOR_STREAM = "mesh, gRPC door, one stream per client (perf_analyzer --streaming)"
DOOR_HTTP = "mesh, v2 REST door (perf_analyzer -i http)"
OLD = "mesh, old path (unary calls, no merging)"
MESH = "mesh (streams, merged calls)"
REFERENCE = "reference design (FastAPI + httpx, JSON in)"
SAME_WORK = "mesh, the reference's work (digits-features: JSON features in, one hop)"


def _measure(
    fn: Callable[[bytes], object],
    blobs: list[bytes],
    loads: dict[str, tuple[str, list[bytes]]],
    c: int,
    window: float,
    rounds: int,
    with_library: bool,
    door: Callable[[int, float, bool], Stats] | None = None,
) -> dict[str, Stats]:
    """Every system at concurrency c, `rounds` times in turn; the median round of each."""
    following = cycle(blobs)
    systems: dict[str, Callable[[], Stats]] = {
        "in-process": lambda: run_threads(lambda: fn(following()), c, window, warmup_s=1.0)
    }
    for label, (target, raws) in loads.items():
        # The echo topology answers in milliseconds whatever the pipeline: a short window.
        w = min(window, 5.0) if label == HOPS else window
        systems[label] = lambda t=target, r=raws, w=w: asyncio.run(http_closed_loop(t, r, c, w))
    if door is not None:
        systems[DOOR] = lambda: door(c, window, False)
        systems[DOOR_STREAM] = lambda: door(c, window, True)
        systems[DOOR_HTTP] = lambda: door(c, window, None)
    if with_library:
        systems.update(_reference_library(blobs, c, window))
    runs: dict[str, list[Stats]] = {label: [] for label in systems}
    for _ in range(rounds):
        for label, measure in systems.items():
            runs[label].append(measure())
    return {label: median(r) for label, r in runs.items()}


def _door(
    address: str, rest: str, pipeline: str, blobs: list[bytes], env: dict[str, str]
) -> Callable[[int, float, bool | None], Stats]:
    """The pipeline as a v2 model loaded by perf_analyzer with the same images in turn: at
    the gRPC door by unary calls or on ModelStreamInfer streams, or (`streaming` None) at
    the v2 REST door (`rest`: its host:port)."""

    def measure(c: int, window: float, streaming: bool | None) -> Stats:
        try:
            return perf_analyzer.measure(
                address if streaming is not None else rest,
                pipeline,
                c,
                window,
                input_data={"image": blobs},
                env=env,
                streaming=bool(streaming),
                protocol="grpc" if streaming is not None else "http",
            )
        except RuntimeError as exc:
            # perf_analyzer stops at a request's first error: at c=32 the `ocr` pipeline
            # sheds pages beyond its megapixels in flight (503 / UNAVAILABLE, by design), or
            # a page queued behind 31 others outlives its 15 s budget (504), which ends that
            # row, not the run. The row shows no throughput and one error.
            text = str(exc)
            failed = ("Failed to maintain requested inference load", "had error:")
            if not any(f in text for f in failed):
                raise
            reason = next((line for line in text.splitlines() if "had error:" in line), "")
            print(f"{pipeline} at c={c}: perf_analyzer stopped at a failed request {reason}")
            return Stats(0, 1, window, float("nan"), float("nan"))

    return measure


def _json_post(url: str, payload: object) -> bytes:
    import json

    return post_bytes(url, json.dumps(payload).encode(), "application/json")


def _summary(name: str, c: int, stats: dict[str, Stats]) -> list[str]:
    mesh, old = stats[MESH], stats[OLD]
    out = [
        f"`{name}` c={c}: mesh vs its old path: throughput {mesh.rps:.1f} vs {old.rps:.1f} "
        f"req/s = {mesh.rps / old.rps:.2f}x, p50 {mesh.p50_ms:.2f} vs {old.p50_ms:.2f} ms = "
        f"{mesh.p50_ms / old.p50_ms:.2f}x"
    ]
    if c == 1:
        base, hops = stats["in-process"], stats[HOPS]
        out.append(
            f"`{name}` c=1: p50 {mesh.p50_ms:.2f} ms = in-process {base.p50_ms:.2f} + hops "
            f"{hops.p50_ms:.2f} + the mesh's own {mesh.p50_ms - hops.p50_ms - base.p50_ms:.2f} ms"
        )
    same, design = stats.get(SAME_WORK), stats.get(REFERENCE)
    if same is not None and design is not None:
        out.append(
            f"`{name}` c={c}: the reference design's own work through the mesh "
            f"(digits-features) vs the reference: throughput {same.rps / design.rps:.2f}x, "
            f"p50 {same.p50_ms / design.p50_ms:.2f}x ({same.p50_ms:.2f} vs "
            f"{design.p50_ms:.2f} ms)"
        )
    for label, ref in stats.items():
        if label.startswith("reference"):
            out.append(
                f"`{name}` c={c}: mesh vs {label}: throughput {mesh.rps / ref.rps:.2f}x, "
                f"p50 {mesh.p50_ms / ref.p50_ms:.2f}x, p99 {mesh.p99_ms / ref.p99_ms:.2f}x "
                f"({mesh.p99_ms:.1f} vs {ref.p99_ms:.1f} ms)"
            )
    return out


def _reference_library(blobs: list[bytes], c: int, window: float) -> dict[str, Callable[[], Stats]]:
    """rapidocr-onnxruntime on the same images, one instance per thread: with its defaults
    (ONNX Runtime's threads per call), and with one ONNX Runtime thread per call."""
    from rapidocr_onnxruntime import RapidOCR

    return {
        label: lambda o=options: run_threads(
            _PerThread(lambda: RapidOCR(**o), blobs), c, window, 2.0
        )
        for label, options in (
            ("reference library, its defaults", {}),
            ("reference library, one ORT thread per call", {"intra_op_num_threads": 1}),
        )
    }


class _PerThread:
    """One engine per worker thread (made on its first call), fed the items in turn."""

    def __init__(self, make: Callable[[], Callable[[object], object]], items: list) -> None:
        self.make = make
        self.local = threading.local()
        self.following = cycle(items)

    def __call__(self) -> object:
        engine = getattr(self.local, "engine", None)
        if engine is None:
            engine = self.local.engine = self.make()
        return engine(self.following())
