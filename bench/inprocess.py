"""The shipped pipelines run in one process: the same recipes and ONNX models, no hops.

This is the reference the mesh is compared with, in the end-to-end tests (same
answers) and in the benchmarks (the limit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from preprocess import recipes as recipe_file
from preprocess.recipes import Recipe
from preprocess.settings import DEFAULT_RECIPES

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "models" / "repository"
DIGITS_MODELS = ("digits_forest", "digits_logreg", "digits_mlp")


def _session(name: str, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(
        str(REPOSITORY / name / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )


class InProcess:
    def __init__(self, threads: int = 1) -> None:
        self.recipes: dict[str, Recipe] = recipe_file.load(DEFAULT_RECIPES)
        self.sessions = {
            n: _session(n, threads) for n in (*DIGITS_MODELS, "ocr_det", "ocr_cls", "ocr_rec")
        }

    def _run(self, model: str, x: np.ndarray) -> list[np.ndarray]:
        session = self.sessions[model]
        return session.run(None, {session.get_inputs()[0].name: x})

    def _run_rows(self, model: str, x: np.ndarray, widths: np.ndarray) -> list[np.ndarray]:
        """A `ragged` model (the recogniser): each row alone at its own width, its outputs
        padded back with zeros, as the predictor runs it."""
        rows = [self._run(model, x[i : i + 1, :, :w]) for i, w in enumerate(widths.tolist())]
        longest = max(r[0].shape[1] for r in rows)
        return [
            np.concatenate([np.pad(r[k], [(0, 0), (0, longest - r[k].shape[1])]) for r in rows])
            for k in range(len(rows[0]))
        ]

    def digits(self, image: bytes) -> dict:
        feats = self.recipes["digits_input"].run({"image": _bytes(image)})["input"]
        probs = {n: self._run(n, feats)[1][0] for n in DIGITS_MODELS}
        mean = np.mean(np.stack(list(probs.values())), axis=0)
        return {"label": int(mean.argmax()), "probabilities": mean.tolist()}

    def digits_features(self, features: np.ndarray) -> dict:
        """The `digits-features` pipeline: rows of 64 features through the same ensemble."""
        x = np.asarray(features, dtype=np.float32).reshape(-1, 64)
        mean = np.mean(np.stack([self._run(n, x)[1] for n in DIGITS_MODELS]), axis=0)
        return {"label": mean.argmax(axis=1).tolist(), "probabilities": mean}

    def ocr_decoding_inputs(self, image: bytes) -> dict[str, np.ndarray] | None:
        """What the `ocr` pipeline sends its decoding step for `image` (None: no text found)."""
        r = self.recipes
        det_in = r["ocr_det_input"].run({"image_bytes": _bytes(image)})
        maps = self._run("ocr_det", det_in["x"])[0]
        crops = r["ocr_crops"].run(
            {"maps": maps, "image": det_in["image"], "transform": det_in["transform"]}
        )
        if len(crops["crop_sizes"]) == 0:
            return None
        cls = self._run("ocr_cls", r["ocr_cls_input"].run(crops)["x"])[0]
        rec_in = r["ocr_rotate_rec_input"].run({**crops, "probs": cls})
        index, prob, space = self._run_rows("ocr_rec", rec_in["x"], rec_in["widths"])
        return {
            "index": index,
            "prob": prob,
            "space": space,
            **{k: rec_in[k] for k in ("boxes", "to_image", "ink", "ink_height")},
        }

    def ocr(self, image: bytes) -> dict:
        decoding = self.ocr_decoding_inputs(image)
        if decoding is None:
            return {"lines": []}
        out = self.recipes["ocr_ctc_decode"].run(decoding)
        lines = [
            {"text": t.decode(), "score": float(s), "box": b.tolist(), "words": []}
            for t, s, b in zip(out["text"], out["score"], out["boxes"], strict=True)
        ]
        for word, box, line in zip(out["words"], out["word_boxes"], out["word_lines"], strict=True):
            lines[line]["words"].append({"text": word.decode(), "box": box.tolist()})
        return {"lines": lines}


def _bytes(blob: bytes) -> np.ndarray:
    out = np.empty(1, dtype=object)
    out[0] = blob
    return out
