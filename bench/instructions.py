"""`python -m bench instructions`: what the proxy executes per request, counted by
valgrind's callgrind rather than timed, for overheads of a few percent that this machine's
timing noise hides (two identical meshes measured side by side differ by up to 15% in
throughput from one run to the next; instruction counts differ by ~3%).

Over one running mesh of the shipped topology (its services), a proxy process at a time
runs under callgrind, instrumentation switched on only once it has answered its warm-up
requests. Each answers `--requests` `digits` requests from `--concurrency` clients (one by
default: in sequence; 32: calls merged as under load, what a request costs then); each is run
`--runs` times, in turn. `--what`:
- `traces` (the default): this tree with traces off, this tree with traces on (every request,
  exported to a receiver), and the proxy of an earlier commit (`--before`);
- `cache`: every image unique (no request a repeat), this tree with the caches off, this tree
  with them on, and the earlier commit with them on: what the caches cost a request they
  cannot answer (issue 26);
- `door`: the same request on `/v1`, as the gRPC door's unary ModelInfer the way its
  nginx front hands it over (HTTP/1.1, proxy/doors/grpc_front.py; nginx's own cost is not
  counted) and on the v2 REST door as tritonclient and perf_analyzer send it (Triton's binary
  tensor extension, both ways), this tree and the earlier commit: what each v2 path costs
  beyond `/v1` (issue 30);
- `predictions`: the prediction log off, and every request recorded to a file (each record
  its own write here, as a request lasts far longer than the log's 50 ms wait for company:
  an upper bound of what a record costs under load, where one write carries many).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench.cache import digit, uploads
from bench.mesh import ROOT, free_port, shipped_mesh
from bench.traces import BEFORE, earlier_tree, receiver_process
from protos import messages
from protos.codec import encode_bytes_elements
from proxy.doors.grpc_front import FRONT_HEADER
from proxy.doors.grpc_front import PATH as FRONT_PATH

PATH = "/v1/pipelines/digits/infer"
V2_PATH = "/v2/models/digits/infer"
WARM = 30


def _ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 600  # Python's start under callgrind takes a minute or two
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError("the proxy under callgrind did not become ready")


def _front_call(image: bytes) -> tuple[str, bytes, dict[str, str]]:
    """`digits` as the gRPC front hands a unary ModelInfer to the proxy: path, body (the
    gRPC message with its 5-byte prefix), headers."""
    message = messages.build_request_bytes("digits", {"image": np.array([image], dtype=object)})
    body = b"\0" + len(message).to_bytes(4, "big") + message
    headers = {"content-type": "application/grpc", FRONT_HEADER.decode(): "1"}
    return FRONT_PATH, body, headers | {"grpc-timeout": "60S"}


def _v2_call(image: bytes) -> tuple[str, bytes, dict[str, str]]:
    """`digits` on the v2 REST door as tritonclient's HTTP client sends it: a JSON header,
    then the image as a length-prefixed BYTES element; the outputs asked for in binary."""
    element = encode_bytes_elements([image])
    tensor = {"name": "image", "datatype": "BYTES", "shape": [1]}
    header = orjson.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": len(element)}}],
            "parameters": {"binary_data_output": True, "timeout": 60_000_000},
        }
    )
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return V2_PATH, header + element, headers


CALLS = {"v1": lambda b: (PATH, b, HEADERS), "front": _front_call, "v2": _v2_call}
"""How each door's request is made of an image."""


def counted(
    tree: Path,
    env: dict[str, str],
    requests: int,
    out: Path,
    unique: bool = False,
    door: str = "v1",
    concurrency: int = 1,
) -> float:
    """Instructions per request of a proxy run from `tree` with `env` (`unique`: no image
    sent twice; `door`: each request on `/v1`, as the gRPC front's ModelInfer (`front`), or
    on the v2 REST door (`v2`); `concurrency`: clients at once, so that calls merge as under
    load)."""
    port = free_port()
    front = door == "front"
    # No gRPC door, or (`front`) one whose servicer the front's route needs, its port unused.
    grpc = {"PROXY_GRPC_PORT": str(free_port()), "PROXY_GRPC_FRONT": "off"} if front else {}
    env = {**env, "PROXY_GRPC_PORT": "off", **grpc}
    callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    proc = subprocess.Popen(
        [*callgrind, "--instr-atstart=no", sys.executable, "-m", "proxy"],
        cwd=tree,
        env={**os.environ, **env, "PROXY_PORT": str(port)} | {"PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    image = digit()
    bodies = uploads(image, 0, WARM + requests) if unique else [image] * (WARM + requests)
    calls = [CALLS[door](b) for b in bodies]
    control = ["callgrind_control"]
    try:
        _ready(url, proc)
        asyncio.run(_drive(url, calls[:WARM], concurrency, front))
        subprocess.run([*control, "-i", "on", str(proc.pid)], check=True, capture_output=True)
        asyncio.run(_drive(url, calls[WARM:], concurrency, front))
        subprocess.run([*control, "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.terminate()
        proc.wait(120)
    total = 0
    for dump in out.parent.glob(f"{out.name}*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
    return total / requests


HEADERS = {"Content-Type": "image/png", "X-Request-Timeout-Ms": "60000"}
"""A `/v1` request's. A long budget: under callgrind (and on a busy machine) the pipeline's
3 s can run out, which is not what is measured."""


async def _drive(
    url: str, calls: list[tuple[str, bytes, dict[str, str]]], concurrency: int, front: bool
) -> None:
    """Every call answered, `concurrency` at a time (each client sends its next on an
    answer)."""
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        left = iter(calls)

        async def one_client() -> None:
            for path, body, headers in left:
                answer = await client.post(path, content=body, headers=headers)
                assert answer.status_code == 200, answer.text
                if front:  # an error comes with its status; nginx adds success's trailer
                    assert "grpc-status" not in answer.headers, answer.headers

        await asyncio.gather(*(one_client() for _ in range(concurrency)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the proxy's instructions per request")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", default=BEFORE, help="the earlier commit to compare with")
    choices = ["traces", "cache", "door", "predictions"]
    parser.add_argument("--what", choices=choices, default="traces")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="clients at once (calls merge past 1)"
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        mesh = stack.enter_context(shipped_mesh("bench-instructions"))
        # No job workers: their polling counts with the wall time (slow under callgrind),
        # not with the requests.
        env = {**mesh.services["proxy"].env, "PROXY_JOBS_WORKERS": "0"}
        endpoint = stack.enter_context(receiver_process())
        # Spans leave in full batches, as under load (never on the clock: a request lasts
        # ~100x longer under callgrind, and exports every 0.2 s carried a few spans each,
        # their fixed cost counted as the spans': 1.268x where batches read 1.215x). At
        # most 127 spans (~4% of a run's) are still queued, uncounted, at the dump.
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
        traced |= {"OTEL_BSP_SCHEDULE_DELAY": "3600000", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "128"}
        earlier = stack.enter_context(earlier_tree(args.before))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="callgrind-")))
        unique = args.what == "cache"
        doors: dict[str, str] = {}
        """Systems whose requests do not go on /v1: their door (`counted`)."""
        if unique:
            # The models' fingerprints are asked again once a second (PROXY_CACHE_CHECK_MS):
            # under callgrind a request takes ~100x as long, so those asks would be counted
            # ~100x over in each request's share. Once an hour here: the requests' own cost.
            cached = {**env, "PROXY_CACHE": "true", "PROXY_CACHE_CHECK_MS": "3600000"}
            systems = {
                "caches off": (ROOT, env),
                "caches on, no repeats": (ROOT, cached),
                f"caches on, before ({args.before})": (earlier, cached),
            }
        elif args.what == "door":
            # The whole pipeline every time (the cache off): what each door adds to a run.
            uncached = {**env, "PROXY_CACHE": "false"}
            systems = {"/v1": (ROOT, uncached)}
            for label, door in (
                ("gRPC front's ModelInfer", "front"),
                ("v2 REST, binary tensors", "v2"),
            ):
                before = f"{label}, before ({args.before})"
                systems |= {label: (ROOT, uncached), before: (earlier, uncached)}
                doors |= {label: door, before: door}
        elif args.what == "predictions":
            logged = {**env, "PROXY_PREDICTION_LOG": str(folder / "predictions.jsonl")}
            systems = {
                "prediction log off": (ROOT, env),
                "prediction log to a file, every request": (ROOT, logged),
            }
        else:
            systems = {
                "traces off": (ROOT, env),
                "traces on, every request": (ROOT, {**env, **traced}),
                f"before ({args.before})": (earlier, env),
            }
        counts: dict[str, list[float]] = {label: [] for label in systems}
        for run in range(args.runs):
            for k, (label, (tree, settings)) in enumerate(systems.items()):
                out = folder / f"{run}-{k}.out"
                door = doors.get(label, "v1")
                per = counted(tree, settings, args.requests, out, unique, door, args.concurrency)
                counts[label].append(per)
                print(f"run {run + 1}, {label}: {per:,.0f} instructions a request", flush=True)
    first = next(iter(counts))
    base = sum(counts[first]) / args.runs
    print(f"\n| proxy | instructions a request (mean) | runs | vs {first} |")
    print("| --- | --- | --- | --- |")
    for label, values in counts.items():
        mean = sum(values) / len(values)
        runs = ", ".join(f"{v / 1e6:.2f}M" for v in values)
        print(f"| {label} | {mean:,.0f} | {runs} | {mean / base:.3f}x |")
    return 0
