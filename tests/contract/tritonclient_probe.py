"""Talk to a v2 server with NVIDIA's tritonclient; print what it saw as JSON.

Runs in its own process: tritonclient registers the same `inference.*`
protobuf messages as this project, and one process may hold only one copy.
Usage: python tests/contract/tritonclient_probe.py HOST:PORT MODEL [shm]
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable

import numpy as np
import tritonclient.grpc as tc


def main(address: str, model: str) -> None:
    client = tc.InferenceServerClient(url=address)
    meta = client.get_model_metadata(model, as_json=True)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    infer_input = tc.InferInput("x", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x)  # binary tensor: raw_input_contents
    outputs = [tc.InferRequestedOutput("y"), tc.InferRequestedOutput("label")]
    result = client.infer(
        model, [infer_input], outputs=outputs, model_version="2", request_id="triton-1"
    )
    response = result.get_response(as_json=True)
    streamed = stream(client, model, infer_input)
    json.dump(
        {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "model_ready": client.is_model_ready(model),
            "server": client.get_server_metadata(as_json=True),
            "metadata": meta,
            "id": response.get("id"),
            "y": result.as_numpy("y").tolist(),
            "label": result.as_numpy("label").tolist(),
            "y_dtype": str(result.as_numpy("y").dtype),
            # Decoded by tritonclient's own model_config.proto / statistics messages.
            "config": client.get_model_config(model, as_json=True)["config"],
            "statistics": client.get_inference_statistics(model, "2", as_json=True),
            "stream": streamed,
            "index": client.get_model_repository_index(as_json=True),
        },
        sys.stdout,
    )


def stream(client: tc.InferenceServerClient, model: str, infer_input: tc.InferInput) -> dict:
    """Three requests on one ModelStreamInfer stream, the second for an unknown model."""
    seen: dict = {}
    done = threading.Event()

    def callback(result: tc.InferResult | None, error: Exception | None) -> None:
        if error is not None:
            seen["error"] = str(error)
        else:
            seen[result.get_response().id] = result.as_numpy("y").tolist()
        if len(seen) == 3:
            done.set()

    client.start_stream(callback=callback)
    for request_id, name in (("s1", model), ("s2", "no-such-model"), ("s3", model)):
        client.async_stream_infer(name, [infer_input], model_version="2", request_id=request_id)
    done.wait(30)
    client.stop_stream()
    return seen


def shared_memory(address: str, model: str) -> None:
    """Triton's system shared memory extension, driven by tritonclient's own helpers."""
    import os

    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import InferenceServerException

    client = tc.InferenceServerClient(url=address)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tag = f"mesh-probe-{os.getpid()}"
    inp = shm.create_shared_memory_region(f"{tag}-in", f"/{tag}-in", 64)
    out = shm.create_shared_memory_region(f"{tag}-out", f"/{tag}-out", 64)
    seen: dict = {}

    def error(call: Callable[[], object]) -> str:
        try:
            call()
        except InferenceServerException as exc:
            return f"{exc.status()} {exc.message()}"
        return "no error"

    try:
        shm.set_shared_memory_region(inp, [x], offset=16)
        client.register_system_shared_memory("in", f"/{tag}-in", 64)
        client.register_system_shared_memory("out", f"/{tag}-out", 48, offset=16)
        seen["status"] = client.get_system_shared_memory_status(as_json=True)
        seen["duplicate"] = error(
            lambda: client.register_system_shared_memory("in", f"/{tag}-in", 64)
        )
        seen["bad_key"] = error(
            lambda: client.register_system_shared_memory("x", "/no-such-mesh-region", 8)
        )
        seen["too_big"] = error(lambda: client.register_system_shared_memory("y", f"/{tag}-in", 65))

        def infer(in_region: str = "in", y_size: int = 24) -> tc.InferResult:
            infer_input = tc.InferInput("x", list(x.shape), "FP32")
            infer_input.set_shared_memory(in_region, x.nbytes, offset=16)
            y = tc.InferRequestedOutput("y")
            y.set_shared_memory("out", y_size, offset=8)
            outputs = [y, tc.InferRequestedOutput("label")]
            return client.infer(model, [infer_input], outputs=outputs, model_version="2")

        result = infer()
        shape = result.get_output("y").shape
        y = shm.get_contents_as_numpy(out, np.float32, shape, offset=16 + 8)
        seen["y"], seen["y_shape"] = y.tolist(), list(shape)
        seen["label"] = result.as_numpy("label").tolist()
        seen["unregistered"] = error(lambda: infer(in_region="nope"))
        seen["output_too_small"] = error(lambda: infer(y_size=16))
        client.unregister_system_shared_memory()
        seen["after_unregister"] = client.get_system_shared_memory_status(as_json=True)
        seen["extensions"] = client.get_server_metadata(as_json=True).get("extensions", [])
    finally:
        shm.destroy_shared_memory_region(inp)
        shm.destroy_shared_memory_region(out)
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    if sys.argv[3:] == ["shm"]:
        shared_memory(sys.argv[1], sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
