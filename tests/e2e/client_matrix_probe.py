"""Ask a v2 server what a user of Triton or KServe asks, with their own clients; print what the
client saw as JSON, normalised so that answers from different doors compare equal.

Runs in its own process (tritonclient registers the same `inference.*` protobuf messages as
this project; kserve lives in its own venv, .venv-kserve):
    python tests/e2e/client_matrix_probe.py CLIENT URL MODEL REQUEST_JSON
CLIENT: triton-http, triton-grpc (tritonclient), kserve-rest, kserve-grpc (kserve's v2
clients: inference and readiness only, all they offer). REQUEST_JSON: {"inputs": [{"name",
"datatype", "shape", "data"}], "classify": output name, "k": top k}; BYTES data is base64.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any

import numpy as np


def _array(spec: dict[str, Any]) -> np.ndarray:
    if spec["datatype"] == "BYTES":
        return np.array([base64.b64decode(v) for v in spec["data"]], dtype=object).reshape(
            spec["shape"]
        )
    dtype = {"FP32": np.float32, "INT64": np.int64}[spec["datatype"]]
    return np.array(spec["data"], dtype=dtype).reshape(spec["shape"])


def _plain(array: np.ndarray) -> list:
    if array.dtype == object:
        return [v.decode() if isinstance(v, bytes) else v for v in array.reshape(-1)]
    return np.round(array.astype(np.float64), 5).reshape(-1).tolist()


def _tensors(specs: list[dict]) -> list[list]:
    return sorted([t["name"], t["datatype"], [int(d) for d in t["shape"]]] for t in specs)


def triton(kind: str, url: str, model: str, request: dict) -> dict:
    if kind == "triton-http":
        import tritonclient.http as tc
    else:
        import tritonclient.grpc as tc  # type: ignore[no-redef]
    client = tc.InferenceServerClient(url=url)
    as_json = {} if kind == "triton-http" else {"as_json": True}
    meta = client.get_model_metadata(model, **as_json)
    config = client.get_model_config(model, **as_json)
    config = config.get("config", config)
    inputs = []
    for spec in request["inputs"]:
        tensor = tc.InferInput(spec["name"], spec["shape"], spec["datatype"])
        tensor.set_data_from_numpy(_array(spec))
        inputs.append(tensor)
    plain = client.infer(model, inputs)
    # Its body gzipped, as Triton takes it (Content-Encoding / grpc-encoding).
    if kind == "triton-http":
        packed = client.infer(
            model,
            inputs,
            request_compression_algorithm="gzip",
            response_compression_algorithm="gzip",
        )
    else:
        packed = client.infer(model, inputs, compression_algorithm="gzip")
    asked = [tc.InferRequestedOutput(request["classify"], class_count=request["k"])]
    classified = client.infer(model, inputs, outputs=asked)
    stats = client.get_inference_statistics(model, **as_json)["model_stats"]
    index = client.get_model_repository_index(**as_json)
    index = index.get("models", []) if isinstance(index, dict) else index
    return {
        "ready": client.is_model_ready(model),
        "metadata": {
            "name": meta["name"],
            "inputs": _tensors(meta["inputs"]),
            "outputs": _tensors(meta["outputs"]),
        },
        "config": {
            "name": config["name"],
            "max_batch_size": int(config.get("max_batch_size", 0)),
            "inputs": sorted(
                (i["name"], [int(d) for d in i.get("dims", [])]) for i in config["input"]
            ),
            "outputs": sorted(o["name"] for o in config["output"]),
        },
        "outputs": {o: _plain(plain.as_numpy(o)) for o in _names(plain, kind)},
        "compressed": {o: _plain(packed.as_numpy(o)) for o in _names(packed, kind)},
        "version": _version(plain, kind),
        "classified": _plain(classified.as_numpy(request["classify"])),
        "stats": {
            "names": sorted({s["name"] for s in stats}),
            "succeeded": sum(int(s["inference_stats"]["success"]["count"]) for s in stats),
        },
        "index": sorted((m["name"], m.get("state", "")) for m in index if m["name"] == model),
    }


def _names(result: Any, kind: str) -> list[str]:
    response = result.get_response()
    if kind == "triton-http":
        return sorted(o["name"] for o in response["outputs"])
    return sorted(o.name for o in response.outputs)


def _version(result: Any, kind: str) -> str:
    response = result.get_response()
    return response["model_version"] if kind == "triton-http" else response.model_version


async def kserve(kind: str, url: str, model: str, request: dict) -> dict:
    from kserve import InferInput, InferRequest
    from kserve.inference_client import InferenceGRPCClient, InferenceRESTClient, RESTConfig
    from kserve.protocol.infer_type import RequestedOutput

    inputs = []
    for spec in request["inputs"]:
        tensor = InferInput(spec["name"], spec["shape"], spec["datatype"])
        tensor.set_data_from_numpy(_array(spec), binary_data=True)  # raw contents either way
        inputs.append(tensor)
    classify = RequestedOutput(request["classify"], parameters={"classification": request["k"]})
    plain = InferRequest(model_name=model, infer_inputs=inputs, request_id="matrix-1")
    classified = InferRequest(
        model_name=model, infer_inputs=inputs, request_id="matrix-2", request_outputs=[classify]
    )
    if kind == "kserve-rest":
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
        ready = await client.is_model_ready(url, model)
        first = await client.infer(url, plain, model_name=model)
        second = await client.infer(url, classified, model_name=model)
    else:
        client = InferenceGRPCClient(url, timeout=60)
        ready = await client.is_model_ready(model)
        first = await client.infer(plain)
        second = await client.infer(classified)
    await client.close()
    outputs = {o.name: _plain(o.as_numpy()) for o in first.outputs}
    (top,) = second.outputs
    return {
        "ready": ready,
        "outputs": dict(sorted(outputs.items())),
        # kserve 0.21's REST client drops the answer's model_version (InferResponse.from_bytes).
        "version": None if kind == "kserve-rest" else first.model_version or "",
        "classified": _plain(top.as_numpy()),
    }


def main(kind: str, url: str, model: str, request_json: str) -> None:
    request = json.loads(request_json)
    if kind.startswith("triton"):
        seen = triton(kind, url, model, request)
    else:
        seen = asyncio.run(kserve(kind, url, model, request))
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main(*sys.argv[1:5])
