"""`python -m bench reload`: what reloading a model costs the requests that use it meanwhile.

The shipped mesh with its predictors in poll mode (v2server/control.py) on a copy of the
model repository; `digits` at concurrency 8 in interleaved rounds (or `ocr`, `--model
ocr_rec`), steady or while the model's predictor reloads it again and again (a version
folder added, then taken away: each change a reload, its new session built and warmed up
beside the one serving, then swapped in). Reported: answers a second, p50 and p99, and
failed requests, which must be none.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import http_closed_loop, proxy_url, shipped_mesh

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"digits_mlp": "digits-mlp", "ocr_rec": "ocr-rec"}
"""The models a run may reload -> the shipped service that serves it."""


def _copy(repository: Path, into: Path) -> Path:
    """The repository's folders as links to its files: nothing large is copied, and a
    version folder added or removed in the copy is a change the predictor's poll sees."""
    for model in repository.iterdir():
        if not model.is_dir():
            continue
        for path in model.rglob("*"):
            target = into / path.relative_to(repository)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(path, target)
    return into


def _reloading(folder: Path, model: str, stop: threading.Event, period_s: float) -> int:
    """Add version 2 of `model`, then take it away, every `period_s`, until `stop`."""
    source, changes = folder / model / "1", 0
    while not stop.wait(period_s):
        extra = folder / model / "2"
        if extra.exists():
            shutil.rmtree(extra)
        else:
            staging = folder / ".staging-2"
            shutil.copytree(source, staging, symlinks=True)
            staging.rename(extra)
        changes += 1
    return changes


def _reloads(metrics_port: str) -> float:
    """The predictor's own count of its reloads (v2_model_loads_total)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "v2_model_loads_total" and sample.labels.get("outcome") == "reloaded"
    )


def _round(url: str, raw: bytes, args: argparse.Namespace, folder: Path | None) -> Stats:
    stop = threading.Event()
    worker = None
    if folder is not None:
        worker = threading.Thread(
            target=_reloading, args=(folder, args.model, stop, args.period), daemon=True
        )
        worker.start()
    try:
        return asyncio.run(http_closed_loop(url, raw, args.concurrency, args.duration))
    finally:
        stop.set()
        if worker is not None:
            worker.join()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="requests while a model reloads")
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--period", type=float, default=1.0, help="seconds between reloads")
    parser.add_argument("--model", choices=sorted(SERVICES), default="digits_mlp")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    from samples.images import encode, render_digit, text_samples

    pipeline = "ocr" if args.model.startswith("ocr") else "digits"
    image = (
        text_samples(1, seed=3)[0][0]
        if pipeline == "ocr"
        else encode(render_digit(np.eye(8) * 16, scale=4))
    )
    with tempfile.TemporaryDirectory(prefix="bench-reload-") as tmp:
        folder = _copy(ROOT / "models" / "repository", Path(tmp) / "repository")
        extra = {
            "PREDICTOR_REPOSITORY": str(folder),
            "PREDICTOR_MODEL_CONTROL_MODE": "poll",
            "PREDICTOR_REPOSITORY_POLL_SECS": "0.2",
        }
        with shipped_mesh("bench-reload-", extra=extra) as mesh:
            url = proxy_url(mesh)
            raw = post_bytes(url + f"/v1/pipelines/{pipeline}/infer", image, "image/png")
            asyncio.run(http_closed_loop(url, raw, args.concurrency, 2.0))  # warm
            steady: list[Stats] = []
            reloading: list[Stats] = []
            started = time.monotonic()
            for _ in range(args.rounds):
                steady.append(_round(url, raw, args, None))
                reloading.append(_round(url, raw, args, folder))
            spent = time.monotonic() - started
            service = mesh.services[SERVICES[args.model]]
            reloads = _reloads(service.env["PREDICTOR_METRICS_PORT"])
    for name, runs in (("steady", steady), ("reloading", reloading)):
        rps = float(np.median([s.rps for s in runs]))
        p50 = float(np.median([s.p50_ms for s in runs]))
        p99 = float(np.median([s.p99_ms for s in runs]))
        errors = sum(s.errors for s in runs)
        print(
            f"{pipeline} c={args.concurrency}, {name}: {rps:,.0f} req/s, p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms, {errors} failed of {sum(s.requests for s in runs) + errors}",
            flush=True,
        )
    ratio = np.median([r.rps for r in reloading]) / np.median([s.rps for s in steady])
    print(
        f"reloading / steady throughput {ratio:.2f}x ({args.model} reloaded {reloads:.0f} times, "
        f"a change every {args.period} s; {args.rounds} rounds of each, {spent:.0f} s)",
        flush=True,
    )
    return 0
