"""Talk to a v2 server with NVIDIA's tritonclient; print what it saw as JSON.

Runs in its own process: tritonclient registers the same `inference.*`
protobuf messages as this project, and one process may hold only one copy.
Usage: python tests/contract/tritonclient_probe.py HOST:PORT MODEL
"""

from __future__ import annotations

import json
import sys

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
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
