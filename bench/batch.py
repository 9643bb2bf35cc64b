"""`python -m bench batch`: `mesh batch` against the shipped mesh, measured side by side in one
run:

- throughput: 1,000 digit photos in a folder through `mesh batch -c 32`, over the mesh's best
  closed-loop throughput at c=32 on the same photos (the bench's own raw HTTP client, requests
  built beforehand; one small photo over and over runs ~2x faster than the mix, whose sizes
  reach 600 px);
- memory: the batch process's peak resident set over 1,000 and over 20,000 inputs;
- the transport: a Python client posting the same photos at c=32 to the REST door (aiohttp,
  as `mesh batch` does) and on the gRPC door's ModelStreamInfer streams (grpc.aio, 4 streams of
  8 in flight), to choose the batch's default.
Goals (issue 28): throughput >= 0.9x; memory +50 MB at most from 1,000 to 20,000."""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc
import orjson

from bench.httpload import post_bytes
from bench.mesh import ROOT, http_closed_loop, median, proxy_url, shipped_mesh
from models.digits import load_split
from protos import grpc_predict_v2_pb2 as pb
from protos import grpc_predict_v2_pb2_grpc as pb_grpc
from samples.digits import write_folder

GOALS = "Goals (issue 28): batch >= 0.9x the closed loop at c=32; memory +50 MB at most."
MEASURE_RSS = (  # VmHWM: this process's own peak (ru_maxrss keeps the forking parent's)
    "import re, sys\n"
    "from batch.__main__ import main\n"
    "code = main(sys.argv[1:])\n"
    "peak = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
    "print('maxrss_kb', peak, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def run_batch(url: str, folder: Path, out: Path, concurrency: int) -> tuple[float, float, str]:
    """One batch over the folder into a fresh output: (seconds, peak RSS MiB, summary)."""
    out.unlink(missing_ok=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE_RSS, "digits", str(folder), "-o", str(out),
         "--url", url, "-c", str(concurrency)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    rss = re.search(r"maxrss_kb (\d+)", done.stderr)
    summary = next(line for line in done.stderr.splitlines() if " inputs: " in line)
    return seconds, int(rss.group(1)) / 1024 if rss else float("nan"), summary


async def rest_rate(url: str, blobs: list[bytes], concurrency: int = 32) -> float:
    """Inputs/s posting every blob to /infer with aiohttp, `concurrency` at a time."""
    todo = iter(blobs)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def caller() -> None:
            for blob in todo:
                async with session.post("/v1/pipelines/digits/infer", data=blob) as answer:
                    assert answer.status == 200, await answer.text()
                    orjson.loads(await answer.read())

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
    return len(blobs) / (time.perf_counter() - started)


async def stream_rate(address: str, blobs: list[bytes], streams: int = 4, window: int = 8) -> float:
    """Inputs/s sending every blob as `digits` on ModelStreamInfer streams, `window` requests
    in flight on each."""

    def request(i: int, blob: bytes) -> pb.ModelInferRequest:
        image = pb.ModelInferRequest.InferInputTensor(name="image", datatype="BYTES", shape=[1])
        image.contents.bytes_contents.append(blob)
        return pb.ModelInferRequest(model_name="digits", id=str(i), inputs=[image])

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def one(part: list[tuple[int, bytes]]) -> None:
            call = stub.ModelStreamInfer()
            room = asyncio.Semaphore(window)

            async def write() -> None:
                for i, blob in part:
                    await room.acquire()
                    await call.write(request(i, blob))
                await call.done_writing()

            writer = asyncio.create_task(write())
            async for answer in call:
                assert not answer.error_message, answer.error_message
                room.release()
            await writer

        numbered = list(enumerate(blobs))
        started = time.perf_counter()
        await asyncio.gather(*(one(numbered[k::streams]) for k in range(streams)))
    return len(blobs) / (time.perf_counter() - started)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="mesh batch: throughput and memory")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--large", type=int, default=20_000)
    args = parser.parse_args(argv)
    split = load_split()
    images = split.images[split.test_idx]
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    small, large = work / "small", work / "large"
    photos = write_folder(small, images, 1000)
    write_folder(large, images, args.large, seed=29)
    rates, loops, rss, rests, grpcs = [], [], {}, [], []
    with shipped_mesh("bench-batch") as mesh:
        url = proxy_url(mesh)
        target = url + "/v1/pipelines/digits/infer"
        raw = [post_bytes(target, blob, "application/octet-stream") for blob in photos.values()]
        asyncio.run(http_closed_loop(url, raw, 32, 2.0))  # warm
        for _ in range(args.rounds):
            loops.append(asyncio.run(http_closed_loop(url, raw, 32, 5.0)))
            _, rss["1,000"], summary = run_batch(url, small, work / "out.jsonl", 32)
            # Its own rate: from the first request to the last answer (not the interpreter's
            # start, ~1 s of a 1,000-input run).
            rates.append(float(re.search(r"; ([\d.]+)/s over", summary).group(1)))  # type: ignore[union-attr]
        door = f"127.0.0.1:{mesh.services['proxy'].env['PROXY_GRPC_PORT']}"
        blobs = list(photos.values())
        for _ in range(args.rounds + 1):
            rests.append(asyncio.run(rest_rate(url, blobs)))
            grpcs.append(asyncio.run(stream_rate(door, blobs)))
        _, rss[f"{args.large:,}"], large_summary = run_batch(url, large, work / "big.jsonl", 32)
    loop = median(loops)
    rate = sorted(rates)[len(rates) // 2]
    print("\n### Batch\n")
    print("| what | measured | ratio |\n| --- | --- | --- |")
    print(
        f"| 1,000 digit photos, `mesh batch -c 32` | {rate:,.0f} inputs/s | "
        f"{rate / loop.rps:.2f}x the closed loop at c=32 on them ({loop.rps:,.0f}/s) |"
    )
    first, last = rss.values()
    print(
        f"| peak RSS of the batch process | {first:.0f} MiB (1,000), "
        f"{last:.0f} MiB ({args.large:,}) | +{last - first:.0f} MiB |"
    )
    rest, streams = sorted(rests)[len(rests) // 2], sorted(grpcs)[len(grpcs) // 2]
    print(
        f"| the transport, 1,000 photos at c=32 | REST (aiohttp) {rest:,.0f}/s, gRPC door "
        f"streams (grpc.aio) {streams:,.0f}/s | streams {streams / rest:.2f}x REST |"
    )
    print(f"\n{summary}\n{large_summary}\n\n{GOALS}")
    return 0
