"""Call a pipeline at the proxy's gRPC door with NVIDIA's tritonclient; print what it got as
JSON: each image's outputs (or error) by unary calls, then all of them on one stream.

Runs in its own process: tritonclient registers the same `inference.*` protobuf messages
as this project, and one process may hold only one copy.
Usage: python tests/e2e/grpc_door_probe.py HOST:PORT PIPELINE IMAGE_FILE...
"""

from __future__ import annotations

import json
import queue
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as tc


def _image(blob: bytes) -> tc.InferInput:
    tensor = tc.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([blob], dtype=object))
    return tensor


def _outputs(result: tc.InferResult) -> dict[str, object]:
    out = {}
    for meta in result.get_response().outputs:
        array = result.as_numpy(meta.name)
        out[meta.name] = {
            "shape": list(array.shape),
            "data": [v.decode() for v in array.reshape(-1)]
            if array.dtype == object
            else array.tolist(),
        }
    return out


def main(address: str, pipeline: str, files: list[str]) -> None:
    images = [Path(f).read_bytes() for f in files]
    client = tc.InferenceServerClient(url=address)
    unary = []
    for blob in images:
        try:
            unary.append(_outputs(client.infer(pipeline, [_image(blob)], client_timeout=60)))
        except tc.InferenceServerException as exc:
            unary.append({"error": {"status": exc.status(), "message": exc.message()}})
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i, blob in enumerate(images):
        client.async_stream_infer(pipeline, [_image(blob)], request_id=str(i))
    streamed = {}
    for _ in images:
        result, error = answers.get(timeout=60)
        if error is None:
            streamed[result.get_response().id] = _outputs(result)
        else:
            streamed[f"error-{len(streamed)}"] = {"error": str(error)}
    client.stop_stream()
    print(
        json.dumps(
            {
                "ready": client.is_model_ready(pipeline),
                "metadata": client.get_model_metadata(pipeline, as_json=True),
                "unary": unary,
                "stream": streamed,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
