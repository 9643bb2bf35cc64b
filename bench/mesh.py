"""Mesh benchmarks, each a ratio to its baseline measured in the same run.

`python -m bench proxy`: proxy overhead per hop: pipelines of k trivial steps (k = 1, 2, 4)
through the REST proxy vs the same k gRPC calls made directly, at concurrency 1 and 16.

`python -m bench pipelines`: bench/pipelines.py, on the helpers here.

`python -m bench preprocess`: the preprocess service against its recipes in one process.

The benchmarks share the closed-loop HTTP client, the echo repository and the row format
here, so that their figures read alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper

from bench import services
from bench.httpload import Connection, post_bytes
from bench.loadgen import Stats, run_async, run_threads
from protos import messages
from protos.ports import free_port as free_port  # one helper for tests, benches, proxy

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def shipped_mesh(
    prefix: str, port_offset: int = 12000, extra: dict[str, str] | None = None
) -> Iterator:
    """The shipped topology (compose/compose.yaml) as local processes, its log in a temporary
    folder named `prefix*`, `extra` in every process's environment; yields the running
    compose.local.LocalMesh. Ports 20002..21113 (offset 12000): below the ephemeral range,
    clear of the tests' meshes (tests/offsets.py); a second mesh: +14500."""
    from compose.local import DEFAULT_FILE, LocalMesh
    from compose.topology import load

    # Every request run through the pipeline: the benchmarks measure the mesh, not its cache
    # (bench/cache.py turns it on beside). Jobs in SQLite: bench/jobs.py runs its own Redis.
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    environ = {"PROXY_CACHE": "false", "PROXY_JOBS_URL": f"sqlite:///{folder}/jobs.sqlite3"}
    services = load([DEFAULT_FILE], environ=environ, port_offset=port_offset, leave_out={"redis"})
    for service in services.values():
        service.env.update(extra or {})
    with open(folder / "mesh.log", "w") as log:
        mesh = LocalMesh(services, out=log)
        mesh.up()
        try:
            yield mesh
        finally:
            mesh.down()


def proxy_url(mesh) -> str:
    """The REST door of a shipped_mesh."""
    return f"http://127.0.0.1:{mesh.services['proxy'].env['PROXY_PORT']}"


def wait_http(url: str, proc: subprocess.Popen) -> None:
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


@contextlib.contextmanager
def second_proxy(env: dict[str, str], tree: Path = ROOT) -> Iterator[str]:
    """Another proxy process beside a mesh's (`env`: the mesh proxy's environment with the
    changes to measure), REST on a free port, no gRPC door; yields its URL once ready.
    `tree`: the files it runs from (another commit's: bench/traces.py's `earlier_tree`)."""
    with second_proxy_process(env, tree) as (url, _):
        yield url


@contextlib.contextmanager
def second_proxy_process(
    env: dict[str, str], tree: Path = ROOT
) -> Iterator[tuple[str, subprocess.Popen]]:
    """second_proxy's URL and process (for its CPU)."""
    port = free_port()
    own = {"PROXY_PORT": str(port), "PROXY_GRPC_PORT": "off"}
    if tree != ROOT:
        own["PYTHONPATH"] = str(tree)  # its files first on the path
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy"],
        cwd=tree,
        env={**os.environ, **env, **own},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/readyz", proc)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(30)


def cycle(items: list) -> Callable[[], object]:
    """The items in turn, one per call (from any thread)."""
    counter = itertools.count()
    return lambda: items[next(counter) % len(items)]


async def http_closed_loop(
    url: str,
    raw: bytes | list[bytes],
    concurrency: int,
    duration: float,
    ok: tuple[int, ...] = (200,),
    polite: bool = False,
) -> Stats:
    """Closed loop over pre-built requests (a list is sent in turn); a status not in `ok`
    is an error. `polite`: a client told `Retry-After` waits that long before its next
    request (the wait counted in the error's time)."""
    conns = [await Connection.open(url) for _ in range(concurrency)]
    free = list(conns)
    following = cycle(raw if isinstance(raw, list) else [raw])

    async def call() -> None:
        conn = free.pop()
        try:
            status, _ = await conn.request(following())  # type: ignore[arg-type]
            if status not in ok:
                if polite and conn.retry_after is not None:
                    await asyncio.sleep(conn.retry_after)
                    # Idle that long, the server may have closed it (its keep-alive timeout).
                    await conn.close()
                    conn = await Connection.open(url)
                    conns.append(conn)
                raise RuntimeError(status)
        finally:
            free.append(conn)

    try:
        return await run_async(call, concurrency, duration)
    finally:
        for conn in conns:
            await conn.close()


def row(label: str, c: int, s: Stats, base: Stats) -> str:
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
            "PROXY_GRPC_PORT": "off",
            "PROXY_PIPELINES": str(pipes),
            "PROXY_LOG_LEVEL": "WARNING",
        }
        import os

        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy"], cwd=ROOT, env={**os.environ, **env}
        )
        wait_http("http://127.0.0.1:18481/healthz", proxy)
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
                base, mesh = median(base_runs), median(mesh_runs)
                print(row(f"direct gRPC, {k} call(s)", c, base, base))
                print(row(f"proxy, {k}-step pipeline", c, mesh, base), flush=True)
    finally:
        for p in (proxy, pred):
            if p is not None:
                p.terminate()
                p.wait(30)
    return 0


def median(runs: list[Stats]) -> Stats:
    return sorted(runs, key=lambda s: s.rps)[len(runs) // 2]


def interleaved(
    systems: dict[str, str],
    load: Callable[[str, int], Stats],
    concurrencies: tuple[int, ...],
    rounds: int,
) -> dict[int, dict[str, Stats]]:
    """`load(url, c)` on every system in turn, `rounds` times at each concurrency (so that a
    machine's drift falls on all of them alike); the median round of each. Prints each
    round's throughput against the first system's, to show the spread behind a median."""
    for url in systems.values():  # warm: streams open, lanes made, models run once
        load(url, 8)
    table: dict[int, dict[str, Stats]] = {}
    for c in concurrencies:
        runs: dict[str, list[Stats]] = {label: [] for label in systems}
        for _ in range(rounds):
            for label, url in systems.items():
                runs[label].append(load(url, c))
        table[c] = {label: median(r) for label, r in runs.items()}
        first, *others = runs
        for label in others:
            pairs = zip(runs[first], runs[label], strict=True)
            ratios = ", ".join(f"{b.rps / a.rps:.2f}" for a, b in pairs)
            print(f"c={c}: {label} / {first}, throughput per round: {ratios}")
    return table


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
                print(row(f"`{name}` in-process", c, base, base))
                print(row(f"`{name}` over gRPC", c, remote, base), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return 0
