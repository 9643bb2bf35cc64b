"""NVIDIA's own v2 client (tritonclient) works against our predictor unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.modelgen import linear_weights
from tests.procs import Service

PROBE = Path(__file__).with_name("tritonclient_probe.py")


def test_tritonclient_health_metadata_and_binary_infer(predictor: Service) -> None:
    run = subprocess.run(
        [sys.executable, str(PROBE), predictor.address, "linear"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["live"] and seen["ready"] and seen["model_ready"]
    assert seen["server"]["name"] == "inference-mesh-predictor"
    assert seen["metadata"]["name"] == "linear"
    assert seen["metadata"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert seen["id"] == "triton-1"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    w, b = linear_weights(2)
    np.testing.assert_allclose(np.array(seen["y"]), x @ w + b, rtol=1e-5)
    assert seen["label"] == (x @ w + b).argmax(axis=1).tolist()
    assert seen["y_dtype"] == "float32"
    config = seen["config"]
    assert (config["name"], config["platform"], config["max_batch_size"]) == (
        "linear",
        "onnxruntime_onnx",
        16,
    )
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}]
    assert config["dynamic_batching"] == {
        "max_queue_delay_microseconds": "20000",
        "default_queue_policy": {"max_queue_size": 256},
    }
    (stats,) = seen["statistics"]["model_stats"]
    assert (stats["name"], stats["version"]) == ("linear", "2")
    # The probe's own inference (2 rows) happened before it asked.
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    assert int(stats["inference_count"]) >= 2
    streamed = seen["stream"]
    assert streamed["s1"] == streamed["s3"] == seen["y"]
    assert "no-such-model" in streamed["error"]
    index = {(m["name"], m["version"], m["state"]) for m in seen["index"]["models"]}
    assert ("linear", "2", "READY") in index and ("linear", "3", "READY") in index


def test_tritonclient_system_shared_memory(predictor: Service) -> None:
    """Input read from and output written to regions registered through tritonclient, the
    other output still in the message; bad registrations and references are named."""
    run = subprocess.run(
        [sys.executable, str(PROBE), predictor.address, "linear", "shm"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    regions = seen["status"]["regions"]
    assert set(regions) == {"in", "out"}
    assert regions["out"]["offset"] == "16" and regions["out"]["byte_size"] == "48"
    assert seen["duplicate"].startswith("StatusCode.ALREADY_EXISTS")
    assert seen["bad_key"].startswith("StatusCode.INVALID_ARGUMENT")
    assert "no-such-mesh-region" in seen["bad_key"]
    assert seen["too_big"].startswith("StatusCode.INVALID_ARGUMENT")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    w, b = linear_weights(2)
    np.testing.assert_allclose(np.array(seen["y"]), x @ w + b, rtol=1e-5)
    assert seen["y_shape"] == [2, 3]
    assert seen["label"] == (x @ w + b).argmax(axis=1).tolist()
    assert seen["unregistered"].startswith("StatusCode.INVALID_ARGUMENT")
    assert "'nope' is not registered" in seen["unregistered"]
    assert seen["output_too_small"].startswith("StatusCode.INVALID_ARGUMENT")
    assert "output 'y'" in seen["output_too_small"]
    assert seen["after_unregister"].get("regions", {}) == {}
    assert "system_shared_memory" in seen["extensions"]
