"""Predictor benchmark: in-process ONNX Runtime vs the predictor over gRPC, with and
without dynamic batching, for a tiny model and a conv model.

`python -m bench predictor [--duration S] [--concurrency 1 8 32]`
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import yaml

from bench import perf_analyzer, services
from bench.loadgen import Stats, run_threads
from models import convnet
from models.build import DEFAULT_OUT as DIGITS_REPOSITORY
from protos import messages, pb, pb_grpc


def build_repository(root: Path) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """tiny(64-feature logistic regression) and conv, each unbatched and batched."""
    tiny_src = DIGITS_REPOSITORY / "digits_logreg" / "1" / "model.onnx"
    if not tiny_src.exists():
        raise SystemExit("run `python -m models.build` first")
    conv_bytes = convnet.build().SerializeToString()
    rng = np.random.default_rng(0)
    models = {
        "tiny": (
            tiny_src.read_bytes(),
            {"input": rng.random((1, 64), np.float32) * 16},
            {"intra_op_threads": 1, "inter_op_threads": 1},
            64,
        ),
        "conv": (
            conv_bytes,
            {"image": rng.random((1, 3, 224, 224), np.float32)},
            {"intra_op_threads": 1, "inter_op_threads": 1},
            8,
        ),
    }
    # Conv: one single-threaded ONNX Runtime execution per core, like the in-process
    # baseline's thread per call. With ORT's own two-thread pool on cores shared with gRPC
    # and the client, the server's execution threads used 10.5-11.7 ms of CPU per image;
    # this way 7.5-9.6 (in-process: 7.0-7.5 in all), per the CPU split printed below.
    instances = {"tiny": 1, "conv": 2}
    out = {}
    for name, (onnx_bytes, sample, ort_opts, max_batch) in models.items():
        for batched in (False, True):
            model = f"{name}_batched" if batched else name
            (root / model / "1").mkdir(parents=True)
            (root / model / "1" / "model.onnx").write_bytes(onnx_bytes)
            config: dict = {
                "max_batch_size": max_batch,
                "onnxruntime": ort_opts,
                "max_queue_size": 1024,
                "instance_count": instances[name],
            }
            if batched:
                config["dynamic_batching"] = {"max_queue_delay_ms": 1.0}
            (root / model / "config.yaml").write_text(yaml.safe_dump(config))
            out[model] = (root / model / "1" / "model.onnx", sample)
    return out


def start_predictor(repository: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    return services.start(
        "predictors", ["--repository", str(repository), "--shared-memory", "true"], workdir
    )


def in_process(model_path: Path, sample: dict, c: int, duration: float) -> tuple[Stats, float]:
    """The limit: the faster of ONNX Runtime's default threading and one thread per call,
    with its CPU milliseconds per call."""
    best: tuple[Stats, float] | None = None
    for threads in (0, 1):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        started = time.process_time()
        stats = run_threads(lambda s=session: s.run(None, sample), c, duration)
        cpu = _per_call(time.process_time() - started, stats)
        if best is None or stats.rps > best[0].rps:
            best = stats, cpu
    assert best is not None
    return best


def median(runs: list[Stats]) -> Stats:
    return sorted(runs, key=lambda s: s.rps)[len(runs) // 2]


async def over_grpc(address: str, model: str, sample: dict, c: int, duration: float) -> Stats:
    request = messages.build_request(model, sample).SerializeToString()
    return await services.grpc_closed_loop(address, request, c, duration)


KINDS = {
    "in-process onnxruntime": "base",
    "predictor gRPC, no batching": "plain",
    "predictor gRPC, dynamic batching": "batched",
    "predictor gRPC, dynamic batching, input in shared memory": "shm",
    "perf_analyzer (C++ client), no batching": "pa-plain",
    "perf_analyzer, dynamic batching": "pa-batched",
    "perf_analyzer, dynamic batching, shared memory": "pa-shm",
    "perf_analyzer, streaming, no batching": "pa-stream-plain",
    "perf_analyzer, streaming, dynamic batching": "pa-stream-batched",
}
"""Row label -> measurement. "shm" rows use Triton's system shared memory extension; the
perf_analyzer rows load the same server with Triton's C++ client instead of ours (Python,
grpc.aio), which shows what the Python client costs on the shared cores."""


def remote_model(key: str, name: str) -> str:
    return name if key.endswith("plain") else f"{name}_batched"


def measure_remote(
    key: str,
    address: str,
    model: str,
    sample: dict[str, np.ndarray],
    c: int,
    duration: float,
    pa_env: dict[str, str] | None,
) -> Stats:
    """One closed-loop run of a KINDS measurement other than in-process."""
    if key in ("plain", "batched"):
        return asyncio.run(over_grpc(address, model, sample, c, duration))
    if key == "shm":
        return asyncio.run(services.shared_memory_closed_loop(address, model, sample, c, duration))
    # perf_analyzer sends rows of random data shaped like the model's input.
    output_bytes = 64 * max(int(a.nbytes) for a in sample.values())
    return perf_analyzer.measure(
        address,
        model,
        c,
        duration,
        shared_memory=key == "pa-shm",
        streaming=key.startswith("pa-stream"),
        output_bytes=output_bytes,
        env=pa_env,
    )


def _per_call(seconds: float, stats: Stats, warmup_s: float = 0.5) -> float:
    """Milliseconds per call; the warm-up's calls (at the measured rate) used CPU too."""
    calls = stats.rps * (stats.seconds + warmup_s)
    return seconds / calls * 1000 if calls else float("nan")


def served(address: str, model: str) -> int:
    """Requests the predictor has answered for `model` (its ModelStatistics)."""
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest(name=model), timeout=10
        )
    return sum(m.inference_stats.success.count for m in reply.model_stats)


def _cpu_text(split: services.CpuSplit, calls: int) -> str:
    """Milliseconds per answered request (warm-up included on both sides)."""
    parts = [s / calls * 1000 if calls else float("nan") for s in split.parts()]
    return f"{parts[0]:.2f}+{parts[1]:.2f}+{parts[2]:.2f}={sum(parts):.2f}"


def row(label: str, s: Stats, base: Stats) -> str:
    return (
        f"| {label} | {s.rps:,.0f} | {s.rps / base.rps:.2f}x | {s.p50_ms:.2f} | "
        f"{s.p99_ms:.2f} | {s.errors} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--models", nargs="+", choices=["tiny", "conv"], default=["tiny", "conv"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved repetitions; the median round is reported",
    )
    args = parser.parse_args(argv)
    try:
        pa_env: dict[str, str] | None = perf_analyzer.environment()
    except perf_analyzer.Unavailable as exc:
        print(f"perf_analyzer rows left out: {exc}")
        pa_env = None
    kinds = {k: v for k, v in KINDS.items() if pa_env or not v.startswith("pa-")}
    workdir = Path(tempfile.mkdtemp(prefix="bench-predictor-"))
    try:
        models = build_repository(workdir / "repository")
        proc, address = start_predictor(workdir / "repository", workdir)
        cpu_notes: list[str] = []
        try:
            for name in args.models:
                path, sample = models[name]
                print(f"\n### {name} model ({path.stat().st_size // 1024} KiB ONNX)\n")
                print("| system | concurrency | req/s | vs in-process | p50 ms | p99 ms | errors |")
                print("| --- | --- | --- | --- | --- | --- | --- |")
                d = args.duration
                for c in args.concurrency:
                    runs: dict[str, list[Stats]] = {k: [] for k in kinds.values()}
                    cpu: dict[str, list[str]] = {k: [] for k in kinds.values()}
                    for _ in range(args.rounds):  # interleaved: drift hits every kind alike
                        stats, per_call = in_process(path, sample, c, d)
                        runs["base"].append(stats)
                        cpu["base"].append(f"{per_call:.2f}")
                        for key in [k for k in runs if k != "base"]:
                            model = remote_model(key, name)
                            before = served(address, model)
                            with services.cpu_split(proc.pid) as split:
                                runs[key].append(
                                    measure_remote(key, address, model, sample, c, d, pa_env)
                                )
                            calls = served(address, model) - before
                            cpu[key].append(_cpu_text(split, calls))
                    medians = {key: median(r) for key, r in runs.items()}
                    base = medians["base"]
                    for label, key in kinds.items():
                        print(row(label, medians[key], base).replace(" |", f" | {c} |", 1))
                    for client, plain, batched in (
                        ("", "plain", "batched"),
                        (" (perf_analyzer)", "pa-plain", "pa-batched"),
                        (" (perf_analyzer, streaming)", "pa-stream-plain", "pa-stream-batched"),
                    ):
                        if batched in medians:
                            gain = medians[batched].rps / medians[plain].rps
                            print(
                                f"| batching gain at {c}{client} | | {gain:.2f}x vs unbatched "
                                "| | | |",
                                flush=True,
                            )
                    cpu_notes.append(
                        f"{name} c={c}: "
                        + "; ".join(f"{key} {' / '.join(cpu[key])}" for key in kinds.values())
                    )
            print(
                "\nCPU ms per request, each round (in-process: the whole process; over gRPC: "
                "server event loop + server's other threads + client = total):"
            )
            print("\n".join(cpu_notes))
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
