"""Helpers the benchmarks share: start a service process, drive raw ModelInfer calls."""

from __future__ import annotations

import mmap
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.loadgen import Stats, run_async
from compose.processes import start_service
from protos import codec, messages, pb, wire
from protos.channels import METHOD_PREFIX, channel_options
from v2server.shm import SHM_DIR

MODEL_INFER = METHOD_PREFIX + "ModelInfer"


async def shared_memory_closed_loop(
    address: str, model: str, inputs: dict[str, np.ndarray], concurrency: int, duration: float
) -> Stats:
    """ModelInfer with every input in a shared memory region (Triton's extension): one
    region set per worker, registered once; before each call the worker copies its tensors
    into its regions, as a client whose data arrives elsewhere must."""
    tag = f"mesh-bench-{os.getpid()}"
    blobs = {name: np.ascontiguousarray(a).tobytes() for name, a in inputs.items()}
    maps: list[dict[str, mmap.mmap]] = []
    requests: list[bytes] = []
    async with grpc.aio.insecure_channel(address, options=channel_options()) as channel:
        register = channel.unary_unary(
            METHOD_PREFIX + "SystemSharedMemoryRegister",
            request_serializer=pb.SystemSharedMemoryRegisterRequest.SerializeToString,
            response_deserializer=pb.SystemSharedMemoryRegisterResponse.FromString,
        )
        unregister = channel.unary_unary(
            METHOD_PREFIX + "SystemSharedMemoryUnregister",
            request_serializer=pb.SystemSharedMemoryUnregisterRequest.SerializeToString,
            response_deserializer=pb.SystemSharedMemoryUnregisterResponse.FromString,
        )
        infer = channel.unary_unary(
            MODEL_INFER,
            request_serializer=wire.serialize_infer_request,
            response_deserializer=wire.parse_infer_response,
        )
        try:
            for worker in range(concurrency):
                request = pb.ModelInferRequest(model_name=model)
                maps.append({})
                for name, array in inputs.items():
                    key = f"{tag}-{worker}-{name}"
                    (SHM_DIR / key).write_bytes(bytes(len(blobs[name])))
                    fd = os.open(SHM_DIR / key, os.O_RDWR)
                    maps[-1][name] = mmap.mmap(fd, len(blobs[name]))
                    os.close(fd)
                    await register(
                        pb.SystemSharedMemoryRegisterRequest(
                            name=key, key=f"/{key}", byte_size=len(blobs[name])
                        )
                    )
                    tensor = request.inputs.add(
                        name=name, datatype=codec.datatype_of(array), shape=array.shape
                    )
                    tensor.parameters[messages.SHM_REGION].string_param = key
                    tensor.parameters[messages.SHM_BYTE_SIZE].int64_param = len(blobs[name])
                requests.append(request.SerializeToString())
            free = list(range(concurrency))

            async def call() -> None:
                worker = free.pop()
                try:
                    for name, region in maps[worker].items():
                        region[:] = blobs[name]
                    await infer(requests[worker], timeout=30)
                finally:
                    free.append(worker)

            return await run_async(call, concurrency, duration)
        finally:
            await unregister(pb.SystemSharedMemoryUnregisterRequest(name=""))
            for regions in maps:
                for region in regions.values():
                    region.close()
            for path in SHM_DIR.glob(f"{tag}-*"):
                path.unlink()


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds each thread of a process has used so far (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


@dataclass
class CpuSplit:
    """Where a server's CPU went during a measurement, in seconds."""

    loop_s: float = 0.0
    """The main thread: the event loop, gRPC message handling, the servicer."""
    threads_s: float = 0.0
    """Every other thread: model executions, gRPC's poller and I/O threads."""
    client_s: float = 0.0
    """The load generator: the benchmark process and the children it ran to completion
    (perf_analyzer)."""

    def parts(self) -> tuple[float, float, float]:
        return self.loop_s, self.threads_s, self.client_s


def _client_cpu() -> float:
    done = os.times()
    return time.process_time() + done.children_user + done.children_system


@contextmanager
def cpu_split(pid: int) -> Iterator[CpuSplit]:
    split = CpuSplit()
    before, client = thread_cpu(pid), _client_cpu()
    yield split
    after = thread_cpu(pid)
    split.client_s = _client_cpu() - client
    for tid, seconds in after.items():
        used = seconds - before.get(tid, 0.0)
        if tid == pid:
            split.loop_s = used
        else:
            split.threads_s += used


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


def metric_of(base_url: str, sample: str, **labels: str) -> float:
    """Sum of a Prometheus sample (e.g. `proxy_requests_shed_total`) over the series whose
    labels include `labels`, scraped from `<base_url>/metrics` (e.g. the proxy's)."""
    text = urllib.request.urlopen(f"{base_url}/metrics", timeout=10).read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )
