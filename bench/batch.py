"""`python -m bench batch`: `mesh batch` against the shipped mesh, measured side by side in one
run:

- throughput: 1,000 digit photos in a folder through `mesh batch -c 32`, over the mesh's best
  closed-loop throughput at c=32 on the same photos (the bench's own raw HTTP client, requests
  built beforehand; one small photo over and over runs ~2x faster than the mix, whose sizes
  reach 600 px);
- memory: the batch process's peak resident set over 1,000 and over 20,000 inputs;
- the door: the same batch with `--door grpc` (the gRPC door's ModelStreamInfer streams, 4
  streams of 8 in flight) over `--door rest`, to choose the default.
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

from bench.httpload import post_bytes
from bench.mesh import ROOT, http_closed_loop, median, proxy_url, shipped_mesh
from models.digits import load_split
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


def run_batch(
    url: str, folder: Path, out: Path, concurrency: int, *door: str
) -> tuple[float, float, str]:
    """One batch over the folder into a fresh output: (seconds, peak RSS MiB, summary)."""
    out.unlink(missing_ok=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE_RSS, "digits", str(folder), "-o", str(out),
         "--url", url, "-c", str(concurrency), *door],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    rss = re.search(r"maxrss_kb (\d+)", done.stderr)
    summary = next(line for line in done.stderr.splitlines() if " inputs: " in line)
    return seconds, int(rss.group(1)) / 1024 if rss else float("nan"), summary


def own_rate(summary: str) -> float:
    """The batch's own rate: from the first request to the last answer (not the
    interpreter's start, ~1 s of a 1,000-input run)."""
    return float(re.search(r"; ([\d.]+)/s over", summary).group(1))  # type: ignore[union-attr]


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
    rates, grpcs, loops, rss = [], [], [], {}
    with shipped_mesh("bench-batch") as mesh:
        url = proxy_url(mesh)
        door = (
            "--door",
            "grpc",
            "--grpc",
            f"127.0.0.1:{mesh.services['proxy'].env['PROXY_GRPC_PORT']}",
        )
        target = url + "/v1/pipelines/digits/infer"
        raw = [post_bytes(target, blob, "application/octet-stream") for blob in photos.values()]
        asyncio.run(http_closed_loop(url, raw, 32, 2.0))  # warm
        for _ in range(args.rounds):
            loops.append(asyncio.run(http_closed_loop(url, raw, 32, 5.0)))
            _, rss["1,000"], summary = run_batch(url, small, work / "out.jsonl", 32)
            rates.append(own_rate(summary))
            grpcs.append(own_rate(run_batch(url, small, work / "grpc.jsonl", 32, *door)[2]))
        _, rss[f"{args.large:,}"], large_summary = run_batch(url, large, work / "big.jsonl", 32)
    loop = median(loops)
    rate = sorted(rates)[len(rates) // 2]
    rounds = ", ".join(f"{r / s.rps:.2f}x" for r, s in zip(rates, loops, strict=True))
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
    streams = sorted(grpcs)[len(grpcs) // 2]
    print(
        f"| the same, `--door grpc` (the gRPC door's streams) | {streams:,.0f} inputs/s | "
        f"{streams / rate:.2f}x `--door rest` |"
    )
    print(f"\nEach round, `mesh batch` over the closed loop beside it: {rounds}.")
    print(f"\n{summary}\n{large_summary}\n\n{GOALS}")
    return 0
