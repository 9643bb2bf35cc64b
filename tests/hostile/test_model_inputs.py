"""Inputs a model's own graph cannot bound: shapes that take a predictor's memory far past
what the request carries, or that fail deep inside the graph (a caller reaches every model
through the proxy's v2 door, and the services' callers inside the cluster too)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest

from protos import messages, pb_grpc
from tests.conftest import Mesh
from tests.hostile.probe import Watch, memory_mb
from tests.procs import ROOT, start_service
from tests.report import report


def binary_infer(mesh: Mesh, model: str, tensors: dict[str, np.ndarray]) -> httpx.Response:
    """A v2 REST call with its tensors in the binary extension (the smallest body)."""
    kinds = {
        np.dtype(np.uint8): "UINT8",
        np.dtype(np.int32): "INT32",
        np.dtype(np.int64): "INT64",
        np.dtype(np.float32): "FP32",
    }
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(a.shape),
                    "datatype": kinds[a.dtype],
                    "parameters": {"binary_data_size": a.nbytes},
                }
                for name, a in tensors.items()
            ]
        }
    )
    body = header + b"".join(a.tobytes() for a in tensors.values())
    return httpx.post(
        f"{mesh.url}/v2/models/{model}/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=60,
    )


def line(width: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(width).integers(0, 256, (1, 48, width, 3), dtype=np.uint8)
    return {"x": x, "widths": np.array([width], np.int32)}


def test_a_line_too_wide_for_the_recogniser_is_refused_before_it_runs(mesh: Mesh) -> None:
    """The recogniser's memory grows with the square of a line's width: one 20 MiB request
    of a line 140,000 wide took its process from 131 MiB to 21 GB (its Kubernetes pod's
    limit is 608 Mi); this one, 40,000 wide, would take ~2 GB. It takes 8192 at most
    (`max_shape` in its config), refused before the tensor is decoded."""
    with Watch(mesh.local.procs["ocr-rec"].pid) as watch:
        refused = binary_infer(mesh, "ocr_rec", line(40_000))
    assert refused.status_code == 400, refused.text
    assert "dimension 2 is 40000, more than the model takes (8192" in refused.text
    widest = binary_infer(mesh, "ocr_rec", line(8192))
    assert widest.status_code == 200, widest.text
    report(
        f"\nhostile: ocr_rec, a line 40,000 wide (5.8 MB): {refused.status_code}, "
        f"recogniser peak +{watch.cost.peak_growth_mb:.0f} MiB"
    )
    assert watch.cost.peak_growth_mb < 100


@pytest.mark.parametrize(
    ("height", "width", "status", "message"),
    [
        (2010, 640, 400, "dimension 1 is 2010, not a multiple of 32"),
        (8224, 320, 400, "dimension 1 is 8224, more than the model takes (8192"),
        (2080, 2080, 400, "shape [1, 2080, 2080, 3] is 12,979,200 elements, more than the"),
        (8192, 512, 200, ""),  # a receipt: as many pixels as a page of 2048x2048
        (640, 640, 200, ""),
    ],
)
def test_the_detector_takes_the_sizes_its_graph_and_memory_can(
    mesh: Mesh, height: int, width: int, status: int, message: str
) -> None:
    """Sides that are not multiples of 32 failed inside the detector's graph (a broadcast
    of 323 by 324): a 500 and a traceback in its log. Its memory grows with the area
    (~150 MiB a megapixel): more than 2048x2048 pixels in any shape is refused (the
    pipeline sends 2 Mpx at most), and so is a side past 8192."""
    x = np.full((1, height, width, 3), 255, np.uint8)
    r = binary_infer(mesh, "ocr_det", {"x": x})
    assert r.status_code == status, r.text[:300]
    assert message in r.text


def test_tiny_crops_cannot_make_the_preprocessing_build_a_batch_hundreds_of_times_larger(
    mesh: Mesh,
) -> None:
    """2,000 crops of 2x100 (1.4 MB) sent to `ocr_rotate_rec_input`: each line becomes
    48 high and as wide as the widest at that height, a 691 MB batch (488x what came; a
    20 MiB request would ask ~10 GB of a pod whose limit is 640 Mi). Batches a recipe makes
    are checked against `limits.max_batch_bytes` (64 MiB, the services' largest message)
    before they are allocated; a dense page of 120 lines makes 48 MB."""
    count = 2000
    crops = np.full((count, 2, 100, 3), 200, np.uint8)
    crops[:, :, ::3] = 0
    tensors = {
        "crops": crops,
        "crop_sizes": np.tile(np.array([2, 100], np.int32), (count, 1)),
        "probs": np.tile(np.array([1, 0], np.float32), (4 * count, 1)),
        "boxes": np.zeros((count, 4, 2), np.float32),
        "to_image": np.tile(np.eye(3, dtype=np.float32), (count, 1, 1)),
    }
    with Watch(mesh.local.procs["preprocess"].pid) as watch:
        r = binary_infer(mesh, "ocr_rotate_rec_input", tensors)
    assert r.status_code == 400, r.text
    assert "the recogniser's input would be [2000, 48, 2400, 3] uint8" in r.text
    report(
        f"\nhostile: 2,000 crops of 2x100 to ocr_rotate_rec_input: {r.status_code}, "
        f"preprocessing peak +{watch.cost.peak_growth_mb:.0f} MiB"
    )
    assert watch.cost.peak_growth_mb < 200


def test_the_text_decoder_takes_the_steps_the_recogniser_can_make(mesh: Mesh) -> None:
    """A million steps of alternating letters and spaces on one line (12 MB) cost the
    decoder 1.7 s and +271 MiB (half a million words); a 20 MiB request could ask 1.75
    million. It takes what the pipeline makes at most: 1024 lines of 1024 steps."""
    steps = 1_000_000
    index = np.full((1, steps), 5, np.int64)
    index[:, 1::2] = 6624  # the space
    r = binary_infer(
        mesh, "ocr_ctc_decode", {"index": index, "prob": np.full((1, steps), 0.99, np.float32)}
    )
    assert r.status_code == 400, r.text
    assert "dimension 1 is 1000000, more than the model takes (1024" in r.text
    line = binary_infer(
        mesh, "ocr_ctc_decode", {"index": index[:, :1024], "prob": np.ones((1, 1024), np.float32)}
    )
    assert line.status_code == 200, line.text


def test_the_detector_gives_back_what_a_giant_page_took(tmp_path: Path) -> None:
    """ONNX Runtime's arena keeps every byte an execution needed: one 2560x2560 page left the
    detector holding ~1.1 GB for good (it now takes 2048x2048 pixels at most). The shipped
    detector (`arena: outliers`) gives back what an execution far larger than the usual ones
    took, and keeps what those need."""
    service = start_service(
        "predictors",
        ["--repository", str(ROOT / "models" / "repository"), "--models", "ocr_det"],
        tmp_path,
    )
    pid = service.proc.pid
    try:
        with grpc.insecure_channel(
            service.address,
            options=[
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_receive_message_length", 64 << 20),
            ],
        ) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            def page(h: int, w: int) -> tuple[int, ...]:
                x = np.random.default_rng(h).integers(0, 256, (1, h, w, 3), dtype=np.uint8)
                request = messages.build_request("ocr_det", {"x": x})
                return tuple(stub.ModelInfer(request, timeout=120).outputs[0].shape)

            for _ in range(4):  # the usual traffic: pages of a phone's screen
                assert page(736, 960) == (1, 1, 736, 960)
            usual, _ = memory_mb(pid)
            assert page(2048, 2048) == (1, 1, 2048, 2048)
            after, peak = memory_mb(pid)
            assert page(736, 960) == (1, 1, 736, 960)
    finally:
        service.stop()
    report(
        f"ocr_det, one 2048x2048 page among 736x960 ones: resident {usual:.0f} MiB before, "
        f"peak {peak:.0f}, {after:.0f} after"
    )
    assert peak - usual > 400, "the giant page did not take the memory it takes"
    assert after - usual < 0.25 * (peak - usual), (usual, peak, after)


def test_a_service_keeps_no_refused_request(tmp_path: Path) -> None:
    """A refused unary call was answered with context.abort: grpc.aio keeps the AbortError on
    the call's state, which its handler's frames hold, and the error's traceback holds those
    frames and the request in them, a cycle freed only by a full collection (rare by design,
    protos/heap.py). 19 refused photos of 18 MiB kept ~340 MiB in the preprocessing so."""
    service = start_service(
        "preprocess", ["--config", str(ROOT / "preprocess" / "recipes.yaml")], tmp_path
    )
    pid = service.proc.pid
    photo = np.empty(1, dtype=object)
    photo[0] = np.random.default_rng(0).integers(0, 256, 18 << 20, dtype=np.uint8).tobytes()
    try:
        with grpc.insecure_channel(
            service.address, options=[("grpc.max_send_message_length", 64 << 20)]
        ) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            before, _ = memory_mb(pid)
            request = messages.build_request("ocr_det_input", {"picture": photo})
            for _ in range(16):  # an input the recipe does not have: INVALID_ARGUMENT
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ModelInfer(request, timeout=30)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            held = memory_mb(pid)[0] - before
            for _ in range(100):  # freed memory is given back within seconds (protos/heap.py)
                if held < 100:
                    break
                time.sleep(0.2)
                held = memory_mb(pid)[0] - before
    finally:
        service.stop()
    report(f"preprocess after 16 refused calls of 18 MiB: +{held:.0f} MiB")
    assert held < 100
