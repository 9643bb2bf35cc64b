"""Word gaps from the lines' ink: the recogniser's input measured (ocr_ink), and the decoding
step weighing each gap between two characters by it (ocr_gaps.py, ocr_text.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from preprocess import recipes as recipe_file
from preprocess.ocr_gaps import STEP_PX, empty_runs
from preprocess.ocr_text import charset
from preprocess.recipes import Recipe
from preprocess.settings import DEFAULT_RECIPES
from protos.errors import InvalidInput
from samples.images import render_lines

ROOT = Path(__file__).resolve().parents[2]
ALPHABET = charset(ROOT / "models/repository/ocr_rec/characters.txt")
SPACE = len(ALPHABET) - 1  # the recogniser's space class: after the blank and the characters


@pytest.fixture(scope="module")
def recipes() -> dict[str, Recipe]:
    return recipe_file.load(DEFAULT_RECIPES)


def _rec_input(recipes: dict[str, Recipe], image: np.ndarray) -> dict[str, np.ndarray]:
    """One line image through `ocr_rotate_rec_input` as the pipeline sends it."""
    h, w = image.shape[:2]
    return recipes["ocr_rotate_rec_input"].run(
        {
            "crops": image[np.newaxis],
            "crop_sizes": np.array([[h, w]], np.int32),
            "probs": np.array([[1.0, 0.0]], np.float32),
            "boxes": np.array([[[0, 0], [w, 0], [w, h], [0, h]]], np.float32),
            "to_image": np.eye(3, dtype=np.float32)[np.newaxis],
        }
    )


def test_the_gap_between_two_words_is_the_widest_in_the_ink(recipes: dict[str, Recipe]) -> None:
    image, _ = render_lines(["Invoice total"])
    out = _rec_input(recipes, image)
    ink, height = out["ink"][0], float(out["ink_height"][0])
    width = out["widths"][0]
    assert out["ink"].shape == (1, out["x"].shape[2]) and out["ink"].dtype == np.uint8
    assert 8 < height < 48, "the text's height, not the line box's"
    # The columns between the words hold no ink, for longer than anywhere inside a word.
    written = np.flatnonzero(ink)
    runs = np.diff(written) - 1
    assert runs.max() >= 0.25 * height
    assert np.sort(runs)[-2] < 0.6 * runs.max(), "one gap stands out: the word gap"
    assert not ink[width:].any(), "the batch's padding is not ink"
    # Light text on dark paper: the same columns.
    flipped = _rec_input(recipes, 255 - image)
    np.testing.assert_array_equal(flipped["ink"], out["ink"])
    assert flipped["ink_height"][0] == height


def test_empty_runs_are_measured_between_each_pair_of_centres() -> None:
    columns = np.array([5, 5, 0, 0, 0, 5, 5, 0, 5, 5, 5, 0, 0, 0, 0, 0, 5], np.uint8)
    np.testing.assert_array_equal(empty_runs(columns, np.array([0, 6, 9, 16])), [3, 1, 5])
    # A run is counted only inside the pair's span.
    np.testing.assert_array_equal(empty_runs(columns, np.array([3, 6])), [2])
    assert empty_runs(columns, np.array([4])).shape == (0,)


def _decode(
    recipes: dict[str, Recipe], steps: list[int], space: list[float], gaps: dict[int, int]
) -> str:
    """Decode one line whose characters (`steps`: class per step, 0 the blank) were read
    over ink that is solid except for `gaps` (first column: width) of empty columns."""
    index = np.array([steps], np.int64)
    columns = np.full((1, len(steps) * STEP_PX), 9, np.uint8)
    for start, width in gaps.items():
        columns[0, start : start + width] = 0
    out = recipes["ocr_ctc_decode"].run(
        {
            "index": index,
            "prob": np.full(index.shape, 0.9, np.float32),
            "space": np.array([space], np.float32),
            "ink": columns,
            "ink_height": np.array([24.0], np.float32),
        }
    )
    return out["text"][0].decode()


def _at(char: str) -> int:
    return ALPHABET.index(char)


def test_a_faint_gap_is_a_space_where_the_ink_shows_one(recipes: dict[str, Recipe]) -> None:
    a, b, c, d = (_at(x) for x in "abcd")
    steps = [a, 0, b, 0, 0, c, 0, d]  # the gap between b and c: steps 3-4, px 24-40
    faint = [0, 0, 0, 0.05, 0.05, 0, 0, 0]
    assert _decode(recipes, steps, faint, {24: 14}) == "ab cd"
    # The same output from the recogniser over ink without that gap: one word.
    assert _decode(recipes, steps, faint, {}) == "abcd"


def test_the_recognisers_own_space_inside_a_word_is_dropped(recipes: dict[str, Recipe]) -> None:
    """Small text: the recogniser puts spaces inside words, where the ink runs on."""
    a, b, c, d = (_at(x) for x in "abcd")
    steps = [a, SPACE, b, 0, c, 0, d]
    likely = [0, 0.9, 0, 0, 0, 0, 0]
    assert _decode(recipes, steps, likely, {}) == "abcd"
    assert _decode(recipes, steps, likely, {6: 12}) == "a bcd"


def test_ink_of_the_wrong_shape_is_refused(recipes: dict[str, Recipe]) -> None:
    given = {
        "index": np.zeros((2, 5), np.int64),
        "prob": np.ones((2, 5), np.float32),
        "space": np.zeros((2, 5), np.float32),
        "ink_height": np.ones(2, np.float32),
    }
    with pytest.raises(InvalidInput, match=r"input 'ink' \[1, 40\] must be \[2, W\]"):
        recipes["ocr_ctc_decode"].run({**given, "ink": np.zeros((1, 40), np.uint8)})
    with pytest.raises(InvalidInput, match=r"input 'ink_height' \[3\] must be \[2\]"):
        recipes["ocr_ctc_decode"].run(
            {**given, "ink": np.zeros((2, 40), np.uint8), "ink_height": np.ones(3, np.float32)}
        )
