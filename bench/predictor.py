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
from pathlib import Path

import numpy as np
import onnxruntime as ort
import yaml

from bench import services
from bench.loadgen import Stats, run_threads
from models import convnet
from models.build import DEFAULT_OUT as DIGITS_REPOSITORY
from protos import codec


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
            {"intra_op_threads": 0},
            8,
        ),
    }
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
            }
            if batched:
                config["dynamic_batching"] = {"max_queue_delay_ms": 1.0}
            (root / model / "config.yaml").write_text(yaml.safe_dump(config))
            out[model] = (root / model / "1" / "model.onnx", sample)
    return out


def start_predictor(repository: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    return services.start("predictors", ["--repository", str(repository)], workdir)


def in_process(model_path: Path, sample: dict, c: int, duration: float) -> Stats:
    """The limit: the faster of ONNX Runtime's default threading and one thread per call."""
    best: Stats | None = None
    for threads in (0, 1):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        stats = run_threads(lambda s=session: s.run(None, sample), c, duration)
        if best is None or stats.rps > best.rps:
            best = stats
    assert best is not None
    return best


def median(runs: list[Stats]) -> Stats:
    return sorted(runs, key=lambda s: s.rps)[len(runs) // 2]


async def over_grpc(address: str, model: str, sample: dict, c: int, duration: float) -> Stats:
    request = codec.build_request(model, sample).SerializeToString()
    return await services.grpc_closed_loop(address, request, c, duration)


def row(label: str, s: Stats, base: Stats) -> str:
    return (
        f"| {label} | {s.rps:,.0f} | {s.rps / base.rps:.2f}x | {s.p50_ms:.2f} | "
        f"{s.p99_ms:.2f} | {s.errors} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved repetitions; the median round is reported",
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-predictor-"))
    try:
        models = build_repository(workdir / "repository")
        proc, address = start_predictor(workdir / "repository", workdir)
        try:
            for name in ("tiny", "conv"):
                path, sample = models[name]
                print(f"\n### {name} model ({path.stat().st_size // 1024} KiB ONNX)\n")
                print("| system | concurrency | req/s | vs in-process | p50 ms | p99 ms | errors |")
                print("| --- | --- | --- | --- | --- | --- | --- |")
                for c in args.concurrency:
                    runs: dict[str, list[Stats]] = {"base": [], "plain": [], "batched": []}
                    for _ in range(args.rounds):  # interleaved: drift hits all three alike
                        runs["base"].append(in_process(path, sample, c, args.duration))
                        runs["plain"].append(
                            asyncio.run(over_grpc(address, name, sample, c, args.duration))
                        )
                        runs["batched"].append(
                            asyncio.run(
                                over_grpc(address, f"{name}_batched", sample, c, args.duration)
                            )
                        )
                    base, plain, batched = (median(runs[k]) for k in ("base", "plain", "batched"))
                    for label, s in (
                        ("in-process onnxruntime", base),
                        ("predictor gRPC, no batching", plain),
                        ("predictor gRPC, dynamic batching", batched),
                    ):
                        print(row(label, s, base).replace(" |", f" | {c} |", 1), flush=True)
                    print(
                        f"| batching gain at {c} | | {batched.rps / plain.rps:.2f}x "
                        f"vs unbatched | | | |",
                        flush=True,
                    )
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
