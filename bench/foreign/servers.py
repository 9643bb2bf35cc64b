"""Foreign v2 servers as processes on 127.0.0.1, each from its own venv (made by
`./mesh test`): MLServer with a custom onnxruntime runtime, and KServe's Python model server.
Both serve one of our ONNX classifiers under a name we choose. They bind port 0; the ports
are read from /proc and the gRPC one is the port that answers ServerReady."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

import protos
from compose.processes import ROOT, socket_inodes, stop_process, tcp_sockets
from protos import pb, pb_grpc

LISTEN = "0A"

HERE = Path(__file__).resolve().parent
VENVS = {"mlserver": ROOT / ".venv-mlserver", "kserve": ROOT / ".venv-kserve-server"}
ONNX = ROOT / "models" / "repository" / "digits_mlp" / "1" / "model.onnx"
NAME = "digits"
"""As a user names a digits model, and as the mesh names a pipeline."""


def available(kind: str) -> bool:
    return (VENVS[kind] / "bin" / "python").exists()


@dataclass
class Foreign:
    kind: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        stop_process(self.proc)


def listening_ports(pid: int) -> set[int]:
    """TCP ports process `pid` listens on (from /proc)."""
    inodes = socket_inodes(pid)
    return {
        int(fields[1].split(":")[1], 16)
        for fields in tcp_sockets()
        if fields[3] == LISTEN and fields[9] in inodes
    }


def _grpc_port(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}:\n{log_path.read_text()[-5000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"not ready in {timeout} s:\n{log_path.read_text()[-5000:]}")
        for port in sorted(listening_ports(proc.pid)):
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                try:
                    if stub.ServerReady(pb.ServerReadyRequest(), timeout=1).ready:
                        return port
                except grpc.RpcError:
                    pass  # not gRPC, or not ready yet
        time.sleep(0.2)


def foreign_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a foreign server: without the grpc setting the mesh's own processes
    start with (protos.GRPC_EXPERIMENTS), so that it runs as its users run it; a value the
    user chose stays."""
    return {
        k: v
        for k, v in environ.items()
        if not (k == "GRPC_EXPERIMENTS" and v == protos.GRPC_EXPERIMENTS)
    }


def start(kind: str, workdir: Path, model: str, onnx: Path, timeout: float = 120) -> Foreign:
    """Serve `onnx` as `model` on a foreign server of `kind` (mlserver, kserve)."""
    workdir.mkdir(parents=True, exist_ok=True)
    python = VENVS[kind] / "bin" / "python"
    env = {**foreign_environment(os.environ), "PYTHONPATH": str(HERE)}
    if kind == "mlserver":
        folder = workdir / "mlserver"
        (folder / model).mkdir(parents=True, exist_ok=True)
        settings = {
            "host": "127.0.0.1",
            "http_port": 0,
            "grpc_port": 0,
            "metrics_port": 0,
            "parallel_workers": 0,
        }
        (folder / "settings.json").write_text(json.dumps(settings))
        # Declared as a user declares them (MLServer reports nothing it is not told).
        model_settings = {
            "name": model,
            "implementation": "mlserver_runtime.OnnxClassifier",
            "parameters": {"uri": str(onnx), "version": "1"},
            "versions": ["1"],
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}],
            "outputs": [
                {"name": "label", "datatype": "INT64", "shape": [-1]},
                {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
            ],
        }
        (folder / model / "model-settings.json").write_text(json.dumps(model_settings))
        cmd = [str(VENVS[kind] / "bin" / "mlserver"), "start", str(folder)]
    else:
        cmd = [str(python), str(HERE / "kserve_server.py"), model, str(onnx), "0", "0"]
    log_path = workdir / f"{kind}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    port = _grpc_port(proc, log_path, timeout)
    return Foreign(kind, proc, port, log_path)
