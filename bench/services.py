"""Helpers the benchmarks share: start a service process, drive raw ModelInfer calls."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc

from bench.loadgen import Stats, run_async
from protos import wire
from v2server.server import channel_options

ROOT = Path(__file__).resolve().parent.parent
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def start(module: str, args: list[str], workdir: Path) -> tuple[subprocess.Popen, str]:
    """`python -m module args` on a free port; returns it once ready, with its address."""
    port_file = workdir / f"{module}.port.json"
    cmd = [
        sys.executable,
        "-m",
        module,
        *args,
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    while not port_file.exists():
        if proc.poll() is not None:
            raise SystemExit(f"{module} failed to start")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{json.loads(port_file.read_text())['grpc']}"


async def grpc_closed_loop(
    address: str, request: bytes, concurrency: int, duration: float, calls: int = 1
) -> Stats:
    """Send the serialized `request` (`calls` times in a row per measured request), like a
    proxy forwarding tensor bytes it already holds."""
    async with grpc.aio.insecure_channel(address, options=channel_options()) as channel:
        infer = channel.unary_unary(
            MODEL_INFER,
            request_serializer=wire.serialize_infer_request,
            response_deserializer=wire.parse_infer_response,
        )

        async def call() -> None:
            for _ in range(calls):
                await infer(request, timeout=30)

        return await run_async(call, concurrency, duration)
