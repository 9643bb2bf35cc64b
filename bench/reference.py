"""The design the project started from, as a baseline for `bench pipelines`: a FastAPI proxy
fanning a request out with httpx + asyncio.gather to three FastAPI + onnxruntime
predictors serving the same three digits classifiers; JSON features in (no image, no
preprocessing hop), all-or-nothing, mean of probabilities. Written as such a service is
usually written: pydantic bodies, one shared httpx.AsyncClient, blocking model calls in
`def` handlers (FastAPI runs them in its thread pool), one uvicorn worker per process.

`python -m bench.reference predictor <model.onnx> <port>` and
`python -m bench.reference proxy <port> <url> <url> <url>` run one process each;
`reference_digits()` starts the four and yields the proxy's URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("digits_logreg", "digits_mlp", "digits_forest")


class Features(BaseModel):
    features: list[float]


def predictor_app(model_path: str):
    import numpy as np
    import onnxruntime as ort
    from fastapi import FastAPI

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    wanted = [o.name for o in session.get_outputs() if o.name == "probabilities"]

    app = FastAPI()

    @app.post("/predict")
    def predict(body: Features) -> dict:
        x = np.asarray(body.features, dtype=np.float32).reshape(1, -1)
        (probabilities,) = session.run(wanted, {input_name: x})
        return {"probabilities": probabilities[0].tolist()}

    return app


def proxy_app(urls: list[str]):
    import httpx
    import numpy as np
    from fastapi import FastAPI, HTTPException

    client = httpx.AsyncClient(timeout=3.0, limits=httpx.Limits(max_connections=200))
    app = FastAPI()

    async def one(url: str, body: dict) -> list[float]:
        response = await client.post(f"{url}/predict", json=body)
        response.raise_for_status()
        return response.json()["probabilities"]

    @app.post("/predict")
    async def predict(body: Features) -> dict:
        try:
            answers = await asyncio.gather(*(one(u, body.model_dump()) for u in urls))
        except httpx.HTTPError as exc:
            raise HTTPException(502, f"a predictor failed: {exc}") from None
        mean = np.mean(np.asarray(answers), axis=0)
        return {"label": int(mean.argmax()), "probabilities": mean.tolist()}

    return app


@contextlib.contextmanager
def reference_digits(repository: Path, base_port: int) -> Iterator[str]:
    """The four processes on 127.0.0.1:base_port.. (proxy first); yields the proxy's URL."""
    from bench.mesh import wait_http

    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.reference", *args],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        return proc

    urls = []
    try:
        for i, model in enumerate(MODELS, start=1):
            port = base_port + i
            start("predictor", str(repository / model / "1" / "model.onnx"), str(port))
            urls.append(f"http://127.0.0.1:{port}")
        proxy = start("proxy", str(base_port), *urls)
        for url, proc in zip(urls, procs, strict=False):
            wait_http(f"{url}/docs", proc)
        wait_http(f"http://127.0.0.1:{base_port}/docs", proxy)
        yield f"http://127.0.0.1:{base_port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def main(argv: list[str]) -> int:
    import uvicorn

    kind, *rest = argv
    if kind == "predictor":
        model, port = rest
        app = predictor_app(model)
    elif kind == "proxy":
        port, *urls = rest
        app = proxy_app(urls)
    else:
        raise SystemExit(f"unknown kind {kind!r}: predictor or proxy")
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
