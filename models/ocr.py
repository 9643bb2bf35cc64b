"""PP-OCR models taken out of the rapidocr-onnxruntime wheel (PyPI), nothing from a hub.

The wheel is downloaded with pip (no install: the library is not a run-time
dependency), its three ONNX files become models of the repository, and the
recogniser's character list (ONNX metadata key `character`) is written beside it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import yaml

WHEEL = "rapidocr-onnxruntime==1.4.4"
MODELS = {
    "ocr_det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "ocr_cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "ocr_rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
}
CONFIGS = {
    # Detection runs one image of its own size at a time.
    "ocr_det": {"max_batch_size": 1, "warmup": {"x": [1, 3, 64, 64]}},
    "ocr_cls": {
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_ms": 1.0},
        "warmup": {"x": [1, 3, 48, 192]},
    },
    "ocr_rec": {"max_batch_size": 64, "warmup": {"x": [1, 3, 48, 320]}},
}
NAMES = list(MODELS)


def fetch_wheel(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
    if found:
        return found[0]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--dest",
            str(cache),
            WHEEL,
        ],
        check=True,
    )
    return sorted(cache.glob("rapidocr_onnxruntime-1.4.4-*.whl"))[0]


def build(repository: Path, cache: Path) -> None:
    wheel = fetch_wheel(cache)
    with zipfile.ZipFile(wheel) as zf:
        for name, member in MODELS.items():
            folder = repository / name
            (folder / "1").mkdir(parents=True, exist_ok=True)
            (folder / "1" / "model.onnx").write_bytes(zf.read(member))
            (folder / "config.yaml").write_text(yaml.safe_dump({"name": name, **CONFIGS[name]}))
            print(f"{name}: extracted from {wheel.name}")
    rec = onnx.load(str(repository / "ocr_rec" / "1" / "model.onnx"), load_external_data=False)
    meta = {p.key: p.value for p in rec.metadata_props}
    (repository / "ocr_rec" / "characters.txt").write_text(
        meta["character"] + "\n", encoding="utf-8"
    )
