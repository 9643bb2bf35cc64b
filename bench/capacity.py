"""`python -m bench capacity`: the CPU each service of the shipped topology spends per
request of each pipeline, and each service's peak memory, measured on the local mesh
(every service a process) under closed-loop REST load; written to `deploy/capacity.json`,
from which `python -m deploy.capacity` plans replicas and `deploy/kubernetes/generate.py`
sizes the pods. CPU is read from /proc (user + system, every thread of the process; the
main thread, the event loop, also alone, since one loop bounds what one replica can
serve), so other load on the machine slows the run but hardly changes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
from pathlib import Path

from bench.httpload import post_bytes
from bench.mesh import ROOT, http_closed_loop, proxy_url, shipped_mesh
from bench.services import thread_cpu

OUTPUT = ROOT / "deploy" / "capacity.json"


def cpu_s(pid: int) -> tuple[float, float]:
    """(every thread, the main thread: the event loop) CPU seconds so far."""
    threads = thread_cpu(pid)
    return sum(threads.values()), threads.get(pid, 0.0)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench capacity", description=__doc__)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per pipeline")
    parser.add_argument("--digits-concurrency", type=int, default=8)
    parser.add_argument("--ocr-concurrency", type=int, default=2)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    from sklearn.datasets import load_digits

    from samples.images import encode, render_digit
    from samples.text import suite

    loads = {
        "digits": (
            [encode(render_digit(image, scale=4)) for image in load_digits().images[:50]],
            args.digits_concurrency,
        ),
        "ocr": ([s.image for s in suite(2, seed=1)], args.ocr_concurrency),
    }
    report: dict = {
        "measured": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load generator on the same",
        "cpus": os.cpu_count(),
        "command": " ".join(["python -m bench capacity", *argv]),
        "pipelines": {},
    }
    with shipped_mesh("bench-capacity-") as mesh:
        url = proxy_url(mesh)
        pids = {name: proc.pid for name, proc in mesh.procs.items()}
        for pipeline, (blobs, concurrency) in loads.items():
            path = f"{url}/v1/pipelines/{pipeline}/infer"
            budget = {"X-Request-Timeout-Ms": "60000"}
            raws = [post_bytes(path, b, "image/png", budget) for b in blobs]
            asyncio.run(http_closed_loop(url, raws, concurrency, 3.0))  # warm-up
            before = {name: cpu_s(pid) for name, pid in pids.items()}
            stats = asyncio.run(http_closed_loop(url, raws, concurrency, args.duration))
            after = {name: cpu_s(pid) for name, pid in pids.items()}
            answered = stats.requests
            report["pipelines"][pipeline] = {
                "concurrency": concurrency,
                "requests": answered,
                "errors": stats.errors,
                "requests_per_s": round(stats.rps, 1),
                "cpu_ms_per_request": {
                    name: round(1000 * (after[name][0] - before[name][0]) / answered, 3)
                    for name in sorted(pids)
                },
                "event_loop_ms_per_request": {
                    name: round(1000 * (after[name][1] - before[name][1]) / answered, 3)
                    for name in sorted(pids)
                },
            }
            print(pipeline, json.dumps(report["pipelines"][pipeline], indent=1), flush=True)
        report["peak_memory_mib"] = {
            name: round(peak_rss_mib(pid), 1) for name, pid in sorted(pids.items())
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.output}")
    return 0
