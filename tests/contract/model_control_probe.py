"""tritonclient's model control calls against a v2 server; print what it saw as JSON.

Runs in its own process (tritonclient registers the same `inference.*` protobuf messages as
this project). Usage: python tests/contract/model_control_probe.py HOST:PORT ACTION MODEL
[CONFIG], ACTION one of load, unload.
"""

from __future__ import annotations

import json
import sys

import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException


def main(address: str, action: str, model: str, config: str | None = None) -> None:
    client = tc.InferenceServerClient(url=address)
    error = None
    try:
        if action == "load":
            client.load_model(model, config=config)
        else:
            client.unload_model(model)
    except InferenceServerException as exc:
        error = {"status": exc.status(), "message": exc.message()}
    json.dump(
        {
            "error": error,
            "ready": client.is_model_ready(model),
            "extensions": client.get_server_metadata(as_json=True)["extensions"],
        },
        sys.stdout,
    )
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
