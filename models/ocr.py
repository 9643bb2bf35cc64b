"""PP-OCR models taken out of the rapidocr-onnxruntime wheel (PyPI), nothing from a hub.

The wheel is downloaded with pip (no install: the library is not a run-time dependency),
its three ONNX files become models of the repository, and the recogniser's character list
(ONNX metadata key `character`) is written beside it. Each graph is edited on the way in
(`models.onnx_edit`, no weight changes, and `models.onnx_fold`):

- every model takes UINT8 images, NHWC as decoded, and normalises them itself
  (pixel / 127.5 - 1, PaddleOCR's mean = std = 0.5): a hop carries a quarter of the bytes;
- the exporter's four-node hard-swish chains become HardSwish nodes (5-10% less time);
- the backbone's scalar affine steps (a Mul and an Add each) are folded into the
  convolutions beside them (40 in the recogniser, 38 in the detector), or made one
  channelwise convolution where they feed a padded one (`models.onnx_fold`): the recogniser
  -18% of its time on one thread, -29% on two; the detector -31% and -10%;
- the recogniser answers its best character and that character's probability per step
  (`index` INT64 [N,T], `prob` FP32 [N,T]) instead of 6,625 probabilities per step, and the
  probability of the space at every step (`space` FP32 [N,T]): the decoder's word gaps.

The same wheel and the same edits give the same files on every build.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import yaml

from models import onnx_edit, onnx_fold

WHEEL = "rapidocr-onnxruntime==1.4.4"
MODELS = {
    "ocr_det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "ocr_cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "ocr_rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
}
CONFIGS = {
    # Detection runs one image of its own size at a time. Its sides must be multiples of 32
    # (other sizes failed deep in the graph), and its memory grows ~150 MiB a megapixel: at
    # most 2048x2048 pixels in any shape (~630 MiB; a receipt 8192 long fits, the pipeline
    # sends 2 Mpx at most, ocr_det_prepare's max_pixels), and 8192 a side. Its arena gives
    # back what an unusually large page took (predictors/arena.py): one 2560x2560 page left
    # it holding 1.1 GB for good.
    "ocr_det": {
        "max_batch_size": 1,
        "warmup": {"x": [1, 64, 64, 3]},
        "inputs": [
            {
                "name": "x",
                "max_shape": [1, 8192, 8192, 3],
                "max_elements": 2048 * 2048 * 3,
                "multiple_of": [1, 32, 32, 1],
            }
        ],
        "onnxruntime": {"arena": "outliers"},
    },
    "ocr_cls": {
        "max_batch_size": 256,
        "dynamic_batching": {"max_queue_delay_ms": 1.0},
        "warmup": {"x": [1, 48, 192, 3]},
    },
    # Each line alone at its own width (predictors/ragged.py), at most 8192 wide: the
    # recogniser's memory grows with the square of the width past ~6400 (+95 MiB at 8192,
    # +986 MiB at 25600, 21 GB at 140000: one 20 MiB request). ocr_rec_batch's max_width.
    "ocr_rec": {
        "max_batch_size": 256,
        "inputs": [{"name": "x", "max_shape": [-1, 48, 8192, 3]}],
        "warmup": {"x": [1, 48, 320, 3]},
        "onnxruntime": {"arena": "outliers"},
        "ragged": {
            "input": "x",
            "axis": 2,
            "lengths": "widths",
            "outputs": {"index": 1, "prob": 1, "space": 1},
        },
    },
}
NAMES = list(MODELS)
SOURCES = ("models/ocr.py", "models/onnx_edit.py", "models/onnx_fold.py")
ROOT = Path(__file__).resolve().parent.parent


def fingerprint() -> str:
    digest = hashlib.sha256(WHEEL.encode() + onnx.__version__.encode())
    for name in SOURCES:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def is_current(repository: Path) -> bool:
    stamp = repository / "ocr_rec" / "build.json"
    try:
        current = json.loads(stamp.read_text()).get("fingerprint") == fingerprint()
    except (OSError, ValueError):
        return False
    return current and all((repository / n / "1" / "model.onnx").is_file() for n in NAMES)


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


def characters(model: onnx.ModelProto) -> list[str]:
    """The recogniser's characters (ONNX metadata `character`, one a line)."""
    meta = {p.key: p.value for p in model.metadata_props}
    return meta["character"].split("\n")


def edit(name: str, model: onnx.ModelProto) -> onnx.ModelProto:
    model, fused = onnx_edit.fuse_hard_swish(model)
    model = onnx_edit.image_input(model, scale=1 / 127.5, offset=-1.0)
    # After the input's own normalisation (a Mul and an Add too), so that it is folded alike.
    model, folded = onnx_fold.fold_scalar_affine(model)
    if name == "ocr_rec":
        # Classes: 0 the CTC blank, then the characters, then the space (PaddleOCR's order).
        space = len(characters(model)) + 1
        model = onnx_edit.argmax_outputs(model, "index", "prob", classes={"space": space})
    onnx.checker.check_model(model)
    print(
        f"{name}: {fused} hard-swish chains fused, {folded.folded} affine steps folded "
        f"({folded.channelwise} more made channelwise), UINT8 NHWC input"
    )
    return model


def build(repository: Path, cache: Path) -> None:
    wheel = fetch_wheel(cache)
    with zipfile.ZipFile(wheel) as zf:
        for name, member in MODELS.items():
            folder = repository / name
            (folder / "1").mkdir(parents=True, exist_ok=True)
            original = onnx.load_from_string(zf.read(member))
            if name == "ocr_rec":
                text = "\n".join(characters(original)) + "\n"
                (folder / "characters.txt").write_text(text, encoding="utf-8")
            onnx.save(edit(name, original), str(folder / "1" / "model.onnx"))
            (folder / "config.yaml").write_text(yaml.safe_dump({"name": name, **CONFIGS[name]}))
            print(f"{name}: extracted from {wheel.name}")
    (repository / "ocr_rec" / "build.json").write_text(
        json.dumps({"fingerprint": fingerprint(), "wheel": wheel.name})
    )
