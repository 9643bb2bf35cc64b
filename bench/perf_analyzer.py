"""Triton's perf_analyzer as a load generator: a C++ v2 client, so that what a benchmark
measures is the server, not a Python client sharing its cores.

The binary comes inside the tritonclient wheel. It needs Debian's libb64 (installed here
with apt-get when running as root) and a libcudart.so.12 to load, which the
nvidia-cuda-runtime-cu12 wheel (a dev dependency) provides; it runs on the CPU.
"""

from __future__ import annotations

import base64
import csv
import ctypes.util
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.loadgen import Stats
from protos.codec import encode_bytes_elements

BINARY = Path(sys.prefix) / "bin" / "perf_analyzer"


class Unavailable(RuntimeError):
    """perf_analyzer cannot run here; the message says what is missing."""


def _cudart_dir() -> Path:
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("no libcudart.so.12: pip install nvidia-cuda-runtime-cu12")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _install_libb64() -> None:
    if ctypes.util.find_library("b64"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable("perf_analyzer needs Debian's libb64-0d (apt-get install libb64-0d)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "libb64-0d"]
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, check=True)
        subprocess.run(install, capture_output=True, env=env, check=True)


def environment() -> dict[str, str]:
    """The environment perf_analyzer runs in; raises Unavailable."""
    if not BINARY.exists():
        raise Unavailable(f"{BINARY} missing (it comes with tritonclient)")
    _install_libb64()
    libs = [str(_cudart_dir()), os.environ.get("LD_LIBRARY_PATH", "")]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(p for p in libs if p)}


def measure(
    address: str,
    model: str,
    concurrency: int,
    seconds: float,
    *,
    shared_memory: bool = False,
    streaming: bool = False,
    output_bytes: int = 1 << 16,
    input_data: dict[str, list[bytes]] | None = None,
    env: dict[str, str] | None = None,
    protocol: str = "grpc",
) -> Stats:
    """Closed-loop load at `concurrency` for about `seconds` (three windows);
    `input_data`: BYTES inputs to send (in turn) instead of random data (a pipeline takes
    images); `protocol`: `grpc`, or `http` (v2 REST: `address` is the REST door's host:port).
    Raises RuntimeError with perf_analyzer's output if it fails."""
    window_ms = max(500, int(seconds * 1000 / 3))
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as tmp:
        report = Path(tmp) / "report.csv"
        extra: list[str] = []
        if input_data is not None:
            data = Path(tmp) / "inputs.json"
            data.write_text(json.dumps(_input_json(input_data)))
            extra = ["--input-data", str(data)]
        args = [
            str(BINARY),
            *("-m", model, "-u", address, "-i", protocol),
            *("--concurrency-range", str(concurrency)),
            *("--measurement-interval", str(window_ms)),
            # Three windows, averaged, whatever they vary by: on this machine the speed
            # drifts more than any useful stability bound, and drift is what the
            # benchmarks' interleaved rounds are for.
            *("--stability-percentage", "1000", "--max-trials", "3"),
            *("-f", str(report)),
            *extra,
        ]
        if streaming:  # every worker's requests on one ModelStreamInfer stream
            args.append("--streaming")
        if shared_memory:
            args += ["--shared-memory", "system", "--output-shared-memory-size", str(output_bytes)]
        done = subprocess.run(
            args, capture_output=True, text=True, env=env or environment(), timeout=600
        )
        if done.returncode != 0 or not report.exists():
            raise RuntimeError(
                f"perf_analyzer exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr}"
            )
        with report.open() as f:
            (row,) = list(csv.DictReader(f))
    rps = float(row["Inferences/Second"])
    return Stats(
        requests=round(rps * window_ms / 1000),
        errors=0,
        seconds=window_ms / 1000,
        p50_ms=float(row["p50 latency"]) / 1000,
        p99_ms=float(row["p99 latency"]) / 1000,
    )


def _input_json(inputs: dict[str, list[bytes]]) -> dict[str, list[dict[str, object]]]:
    """perf_analyzer's --input-data: one entry per request, each BYTES [1] tensor as
    {"b64": ...} of its raw contents (which, for BYTES, carry each element's length)."""
    count = min(len(v) for v in inputs.values())
    return {
        "data": [
            {
                name: {"b64": base64.b64encode(encode_bytes_elements([v[i]])).decode()}
                for name, v in inputs.items()
            }
            for i in range(count)
        ]
    }
