"""Helpers the benchmarks share: start a service process, drive raw ModelInfer calls."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc

from bench.loadgen import Stats, run_async
from protos import wire
from tests.procs import start_service
from v2server.server import channel_options

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def start(module: str, args: list[str], workdir: Path) -> tuple[subprocess.Popen, str]:
    """`python -m module args` on a free port; returns it once ready, with its address."""
    service = start_service(module, [*args, "--log-level", "WARNING"], workdir)
    return service.proc, service.address


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
