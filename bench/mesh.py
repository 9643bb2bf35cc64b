"""Mesh benchmarks, each a ratio to its baseline measured in the same run.

`python -m bench proxy`: proxy overhead per hop: pipelines of k trivial steps (k = 1, 2, 4)
through the REST proxy vs the same k gRPC calls made directly, at concurrency 1 and 16.

`python -m bench pipelines`: the shipped digits and ocr pipelines through the whole mesh
(REST, every service a process) vs the same steps in one process (the limit), and vs the
same topology with nothing in it (bench/hops.py: the hops alone).

`python -m bench preprocess`: the preprocess service against its recipes in one process.

One module over 300 lines on purpose: the three share the closed-loop HTTP client, the
echo repository and the row format, so that their figures read alike.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper

from bench import services
from bench.httpload import Connection, post_bytes
from bench.inprocess import InProcess
from bench.loadgen import Stats, run_async, run_threads
from protos import messages

ROOT = Path(__file__).resolve().parent.parent


def _wait_http(url: str, proc: subprocess.Popen) -> None:
    import urllib.request

    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit("proxy failed to start")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("proxy not ready")


def cycle(items: list) -> Callable[[], object]:
    """The items in turn, one per call (from any thread)."""
    counter = itertools.count()
    return lambda: items[next(counter) % len(items)]


async def http_closed_loop(
    url: str, raw: bytes | list[bytes], concurrency: int, duration: float
) -> Stats:
    """Closed loop over pre-built requests (a list is sent in turn)."""
    conns = [await Connection.open(url) for _ in range(concurrency)]
    free = list(conns)
    following = cycle(raw if isinstance(raw, list) else [raw])

    async def call() -> None:
        conn = free.pop()
        try:
            status, _ = await conn.request(following())  # type: ignore[arg-type]
            if status != 200:
                raise RuntimeError(status)
        finally:
            free.append(conn)

    try:
        return await run_async(call, concurrency, duration)
    finally:
        for conn in conns:
            await conn.close()


def _row(label: str, c: int, s: Stats, base: Stats) -> str:
    return (
        f"| {label} | {c} | {s.rps:,.1f} | {s.rps / base.rps:.2f}x | {s.p50_ms:.2f} | "
        f"{s.p50_ms / base.p50_ms:.2f}x | {s.p99_ms:.2f} | {s.errors} |"
    )


HEADER = (
    "| system | concurrency | req/s | throughput vs baseline | p50 ms | p50 vs baseline "
    "| p99 ms | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
)


# ---------------------------------------------------------------- proxy overhead


def _echo_repository(root: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "echo",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [-1])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [-1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    (root / "echo" / "1").mkdir(parents=True)
    onnx.save(model, root / "echo" / "1" / "model.onnx")
    (root / "echo" / "config.yaml").write_text(yaml.safe_dump({"instance_count": 1}))
    return root


def _chain(k: int) -> dict:
    steps, source = [], "request.body"
    for i in range(k):
        steps.append(
            {
                "call": {
                    "name": f"s{i}",
                    "endpoint": "ECHO_URL",
                    "model": "echo",
                    "inputs": {"x": source},
                }
            }
        )
        source = f"s{i}.y"
    return {"input": "body", "steps": steps, "result": {"size": f"s{k - 1}.y"}}


def proxy_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="proxy overhead per hop")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    repo = _echo_repository(work / "repo")
    pred, address = services.start("predictors", ["--repository", str(repo)], work)
    proxy = None
    try:
        pipes = work / "pipelines.yaml"
        pipes.write_text(yaml.safe_dump({"pipelines": {f"k{k}": _chain(k) for k in (1, 2, 4)}}))
        env = {
            "ECHO_URL": address,
            "PROXY_PORT": "18481",
            "PROXY_PIPELINES": str(pipes),
            "PROXY_LOG_LEVEL": "WARNING",
        }
        import os

        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy"], cwd=ROOT, env={**os.environ, **env}
        )
        _wait_http("http://127.0.0.1:18481/healthz", proxy)
        payload = b"x" * 64
        tensor = np.empty(1, dtype=object)
        tensor[0] = payload
        request = messages.build_request("echo", {"x": tensor}).SerializeToString()

        async def direct(k: int, c: int) -> Stats:
            return await services.grpc_closed_loop(address, request, c, args.duration, calls=k)

        print("\n### Proxy overhead: k trivial steps via REST proxy vs the same k gRPC calls\n")
        print(HEADER)
        for k in (1, 2, 4):
            raw = post_bytes(f"http://127.0.0.1:18481/v1/pipelines/k{k}/infer", payload)
            for c in (1, 16):
                base_runs, mesh_runs = [], []
                for _ in range(args.rounds):
                    base_runs.append(asyncio.run(direct(k, c)))
                    mesh_runs.append(
                        asyncio.run(
                            http_closed_loop("http://127.0.0.1:18481", raw, c, args.duration)
                        )
                    )
                base, mesh = _median(base_runs), _median(mesh_runs)
                print(_row(f"direct gRPC, {k} call(s)", c, base, base))
                print(_row(f"proxy, {k}-step pipeline", c, mesh, base), flush=True)
    finally:
        for p in (proxy, pred):
            if p is not None:
                p.terminate()
                p.wait(30)
    return 0


def _median(runs: list[Stats]) -> Stats:
    return sorted(runs, key=lambda s: s.rps)[len(runs) // 2]


# ---------------------------------------------------------------- shipped pipelines


def pipelines_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="mesh vs in-process for the shipped pipelines")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--ocr-duration", type=float, default=20.0)
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
    from compose.local import DEFAULT_FILE, LocalMesh
    from compose.topology import load
    from proxy.settings import DEFAULT_PIPELINES
    from samples.images import encode, render_digit
    from samples.text import suite

    # Ports 20002..21113: below the ephemeral range, clear of the tests (+20000, +22000).
    services = load([DEFAULT_FILE], environ={}, port_offset=12000)
    log = open(Path(tempfile.mkdtemp(prefix="bench-mesh-")) / "mesh.log", "w")  # noqa: SIM115
    mesh = LocalMesh(services, out=log)
    mesh.up()
    url = f"http://127.0.0.1:{services['proxy'].env['PROXY_PORT']}"
    try:
        from sklearn.datasets import load_digits

        digit = encode(render_digit(load_digits().images[0], scale=4))
        # The same generated images (every category of the text suite) for every system.
        pages = [s.image for s in suite(args.ocr_images_per_category, seed=1)]
        local = InProcess(threads=1)
        floors: list[str] = []
        cases: list[tuple[str, list[bytes], Callable[[bytes], object], float, list[int]]] = [
            ("digits", [digit], local.digits, args.duration, args.concurrency),
            ("ocr", pages, local.ocr, args.ocr_duration, args.ocr_concurrency),
        ]
        pipelines = Path(services["proxy"].env.get("PROXY_PIPELINES", DEFAULT_PIPELINES))
        for name, blobs, fn, duration, levels in cases:
            if name not in args.pipelines:
                continue
            budget = {"X-Request-Timeout-Ms": "60000"}
            raws = [
                post_bytes(f"{url}/v1/pipelines/{name}/infer", b, "image/png", budget)
                for b in blobs
            ]
            print(f"\n### `{name}`: whole mesh over REST vs the same steps in one process\n")
            if name == "ocr":
                print(
                    f"{len(blobs)} images, {args.ocr_images_per_category} per category of "
                    "the generated text suite, sent in turn to every system.\n"
                )
            print(HEADER)
            references: dict[int, Stats] = {}
            with NullMesh(pipelines, name, services["proxy"].env) as null:
                hops_raw = [post_bytes(null.url, b, "image/png") for b in blobs]
                for c in levels:
                    window = duration * max(1.0, c / 8) if name == "ocr" else duration
                    following = cycle(blobs)
                    base = run_threads(lambda f=fn, n=following: f(n()), c, window, warmup_s=1.0)
                    hops = asyncio.run(
                        http_closed_loop(null.url, hops_raw, c, min(duration, args.duration))
                    )
                    mesh_stats = asyncio.run(http_closed_loop(url, raws, c, window))
                    print(_row("in-process", c, base, base))
                    if name == "ocr" and c <= 8:
                        references[c] = _reference_ocr(blobs, c, window, base)
                    print(_row("hops only (same topology, echo services)", c, hops, base))
                    print(_row("mesh (proxy + services)", c, mesh_stats, base), flush=True)
                    if c == 1:
                        floors.append(_floor_line(name, base, hops, mesh_stats))
                    if c in references:
                        floors.append(_reference_line(c, mesh_stats, references[c]))
        print("\n" + "\n".join(floors))
    finally:
        mesh.down()
        log.close()
    return 0


def _reference_ocr(blobs: list[bytes], c: int, window: float, base: Stats) -> Stats:
    """The reference library (rapidocr-onnxruntime, same three models) on the same images,
    one instance per thread: with its defaults (ONNX Runtime's threads per call), and with
    one ONNX Runtime thread per call (its best throughput here); prints both, returns the
    faster one for the ratios."""
    from rapidocr_onnxruntime import RapidOCR

    best: Stats | None = None
    for label, options in (
        ("reference library, its defaults", {}),
        ("reference library, one ORT thread per call", {"intra_op_num_threads": 1}),
    ):
        stats = run_threads(_PerThread(lambda o=options: RapidOCR(**o), blobs), c, window, 2.0)
        print(_row(label, c, stats, base), flush=True)
        best = stats if best is None or stats.rps > best.rps else best
    assert best is not None
    return best


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


def _reference_line(c: int, mesh: Stats, reference: Stats) -> str:
    return (
        f"`ocr` at c={c} against the reference library (the faster of its two settings): "
        f"p50 {mesh.p50_ms:.0f} ms vs {reference.p50_ms:.0f} ms = "
        f"{mesh.p50_ms / reference.p50_ms:.2f}x, throughput {mesh.rps:.2f} vs "
        f"{reference.rps:.2f} req/s = {mesh.rps / reference.rps:.2f}x"
    )


def _floor_line(name: str, base: Stats, hops: Stats, mesh: Stats) -> str:
    """The p50 at concurrency 1 against in-process plus the measured hops."""
    limit = base.p50_ms + hops.p50_ms
    return (
        f"`{name}` p50 at c=1: mesh {mesh.p50_ms:.2f} ms = {mesh.p50_ms / limit:.2f}x "
        f"(in-process {base.p50_ms:.2f} + hops {hops.p50_ms:.2f} ms); the mesh's own cost "
        f"beyond the hops: {mesh.p50_ms - hops.p50_ms:.2f} ms = "
        f"{(mesh.p50_ms - hops.p50_ms) / base.p50_ms:.1f}x in-process"
    )


# ---------------------------------------------------------------- preprocess recipes


def preprocess_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="recipes over gRPC vs in-process")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args(argv)
    from sklearn.datasets import load_digits

    from preprocess import recipes as recipe_file
    from preprocess.settings import DEFAULT_RECIPES
    from samples.images import encode, render_digit, render_lines

    work = Path(tempfile.mkdtemp(prefix="bench-preprocess-"))
    proc, address = services.start("preprocess", [], work)
    try:
        recipes = recipe_file.load(DEFAULT_RECIPES)
        page, _ = render_lines(["A page of text to detect,", "two lines of it."], scale=1.2)
        cases = {
            "digits": ("image", encode(render_digit(load_digits().images[0]))),
            "ocr_det_input": ("image_bytes", encode(page)),
        }
        print("\n### Preprocess recipes: over gRPC vs the same OpenCV code in-process\n")
        print(HEADER)
        for name, (input_name, blob) in cases.items():
            tensor = np.empty(1, dtype=object)
            tensor[0] = blob
            request = messages.build_request(name, {input_name: tensor}).SerializeToString()
            recipe = recipes[name]

            for c in args.concurrency:
                base = run_threads(
                    lambda r=recipe, t=tensor, i=input_name: r.run({i: t}), c, args.duration
                )
                remote = asyncio.run(services.grpc_closed_loop(address, request, c, args.duration))
                print(_row(f"`{name}` in-process", c, base, base))
                print(_row(f"`{name}` over gRPC", c, remote, base), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return 0
