"""The shipped recipes, run in-process against known values."""

from __future__ import annotations

import contextlib
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocess import config as cfg
from preprocess import images, ocr
from preprocess import recipes as recipe_file
from preprocess.ocr_text import Spacing, charset, ctc_line, latin_punctuation
from preprocess.recipes import Recipe
from preprocess.settings import DEFAULT_RECIPES
from protos import media
from protos.decoded import MIN_PIXELS_PARAMETER
from protos.errors import InvalidInput
from samples.images import encode, render_lines
from v2server import triton
from v2server.served import ServedModel

ROOT = Path(__file__).resolve().parents[2]
ALPHABET = charset(ROOT / "models/repository/ocr_rec/characters.txt")
"""The recogniser's classes: the CTC blank (0), the file's characters, a space."""
CLASS = {c: i for i, c in enumerate(ALPHABET)}


@pytest.fixture(scope="module")
def recipes() -> dict[str, Recipe]:
    return recipe_file.load(DEFAULT_RECIPES)


def as_bytes(*blobs: bytes) -> np.ndarray:
    out = np.empty(len(blobs), dtype=object)
    out[:] = list(blobs)
    return out


def test_det_input_shape_and_transform(recipes: dict[str, Recipe]) -> None:
    img, _ = render_lines(["some text"])
    out = recipes["ocr_det_input"].run({"image_bytes": as_bytes(encode(img))})
    x, prepared, tf = out["x"], out["image"], out["transform"]
    # Bytes at the image's own scale (multiples of 32), not floats upscaled to 736.
    assert x.dtype == np.uint8 and x.shape[0] == 1 and x.shape[3] == 3
    assert x.shape[1] % 32 == 0 and x.shape[2] % 32 == 0
    assert prepared.dtype == np.uint8 and prepared.shape[2] == 3
    pad_top, pad_left, rh, rw, h, w = tf.tolist()
    assert (h, w) == img.shape[:2] and pad_left == 0
    # The image lines are cut from is sent without the detector's bands.
    assert prepared.shape[:2] == (round(h / rh), round(w / rw))
    assert abs(x.shape[2] - prepared.shape[1]) <= 16
    assert abs(x.shape[1] - (prepared.shape[0] + 2 * pad_top)) <= 16


# (height, width) of images users send, and of ones no user does: the bounds must hold
# for every shape, the flat and the tall ones most of all.
ODD_SIZES = [
    (16, 8192), (8192, 16), (1, 20_000), (20_000, 1), (20, 20), (64, 64), (300, 900),
    (4423, 392), (6772, 514), (9024, 625), (1300, 3000), (3000, 4000), (2100, 2100),
    (30, 5000), (120, 4000), (5000, 5000),
]  # fmt: skip


@pytest.mark.parametrize(("height", "width"), ODD_SIZES)
def test_what_the_detection_recipe_makes_the_detector_and_crops_take(
    recipes: dict[str, Recipe], height: int, width: int
) -> None:
    """ocr_det_input's `x` within ocr_det's config (multiples of 32, 8192 a side, 2048x2048
    pixels) and ocr_crops' bounds on the map; its `image` at most 4 Mpx, unpadded, and
    its `transform` mapping back to the image as sent."""
    config = cfg_yaml(ROOT / "models/repository/ocr_det/config.yaml")["inputs"][0]
    image = np.full((height, width, 3), 255, np.uint8)
    image[height // 3 : height // 3 + 1] = 0
    out = recipes["ocr_det_input"].run({"image_bytes": as_bytes(encode(image))})
    x, prepared, tf = out["x"], out["image"], out["transform"]
    shape = list(x.shape)
    assert all(s % m == 0 for s, m in zip(shape, config["multiple_of"], strict=True)), shape
    assert all(s <= m for s, m in zip(shape, config["max_shape"], strict=True)), shape
    assert x.size <= config["max_elements"], shape
    assert x.shape[1] * x.shape[2] <= 2_000_000, shape
    maps = next(t for t in recipes["ocr_crops"].inputs if t.name == "maps")
    assert x.shape[1] * x.shape[2] <= maps.max_elements
    assert prepared.shape[0] * prepared.shape[1] <= 4_000_000
    pad_top, _, rh, rw, h, w = tf.tolist()
    assert (h, w) == (height, width)
    assert prepared.shape[:2] == (round(h / rh), round(w / rw))
    # The bands, if any, come to at most the image's height again on each side (at the
    # reference's ratio of 8), and the detector sees the image's aspect.
    assert 0 <= pad_top <= max(prepared.shape[1] / 8, 30)
    seen_h = x.shape[1] * prepared.shape[0] / (prepared.shape[0] + 2 * pad_top)
    if min(seen_h, x.shape[2]) > 64:
        assert seen_h / x.shape[2] == pytest.approx(height / width, rel=0.2)
    # ocr_crops takes what it makes (a map of no text: no lines).
    maps = np.zeros((1, 1, *x.shape[1:3]), np.float32)
    crops = recipes["ocr_crops"].run({"maps": maps, "image": prepared, "transform": tf})
    assert crops["boxes"].shape == (0, 4, 2)


@pytest.mark.parametrize(
    "transform",
    [
        [np.nan, 0, 1, 1, 64, 64],
        [np.inf, 0, 1, 1, 64, 64],
        [1e30, 0, 1, 1, 64, 64],
        [-50, 0, 1, 1, 64, 64],
        [0, 0, np.nan, 1, 64, 64],
        [0, 0, 1, 0, 64, 64],
        [0, 0, 1, 1, -64, 64],
    ],
)
def test_a_transform_ocr_det_prepare_cannot_make_is_refused_naming_it(
    recipes: dict[str, Recipe], transform: list[float]
) -> None:
    """ocr_crops is a model any caller may call on the v2 door: a NaN band or ratio
    answered boxes of NaN (200), a NaN band after the bands moved off the image failed
    inside the operation."""
    maps = np.zeros((1, 1, 64, 64), np.float32)
    maps[0, 0, 20:30, 5:50] = 0.9
    inputs = {"maps": maps, "image": np.full((64, 64, 3), 255, np.uint8)}
    with pytest.raises(InvalidInput, match="input 'transform': expected"):
        recipes["ocr_crops"].run({**inputs, "transform": np.array(transform, np.float32)})
    good = np.array([0, 0, 1, 1, 64, 64], np.float32)
    assert len(recipes["ocr_crops"].run({**inputs, "transform": good})["boxes"]) == 1


@settings(max_examples=500, deadline=None)
@given(
    st.integers(1, 30_000),
    st.integers(1, 30_000),
    st.integers(32, 256),
    st.integers(1_000, 8_000),
    st.integers(262_144, 8_000_000),
)
def test_detection_sizes_keep_every_bound(
    h: int, w: int, min_side: int, max_side: int, max_pixels: int
) -> None:
    """Rounded to the detector's stride, a size still keeps its side and area bounds (a
    nearest rounding took 2000x2000 to 2016x2016, past a bound of 4 Mpx)."""
    max_side = max_side // 32 * 32
    sh, sw = ocr.detection_size(h, w, min_side, max_side, max_pixels)
    assert sh % 32 == 0 and sw % 32 == 0 and sh >= 32 and sw >= 32
    assert max(sh, sw) <= max_side
    assert sh * sw <= max(max_pixels, 32 * max_side)


def cfg_yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def _ocr_session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(ROOT / f"models/repository/{name}/1/model.onnx"))


def test_crops_find_each_line_and_its_box(recipes: dict[str, Recipe]) -> None:
    img, truth = render_lines(["First line 123", "and another one"], scale=1.2)
    det_in = recipes["ocr_det_input"].run({"image_bytes": as_bytes(encode(img))})
    maps = _ocr_session("ocr_det").run(None, {"x": det_in["x"]})[0]
    out = recipes["ocr_crops"].run(
        {"maps": maps, "image": det_in["image"], "transform": det_in["transform"]}
    )
    boxes = out["boxes"]
    # The detector may split a line at wide gaps (the reference pipeline does too):
    # the boxes of each line must together cover that line, in reading order.
    centers = boxes[:, :, 1].mean(axis=1)
    assert (np.diff(centers) > -10).all(), "boxes come top to bottom"
    for x0, y0, x1, y1 in truth:
        line = boxes[(centers > y0) & (centers < y1)]
        assert len(line) >= 1
        assert abs(line[:, :, 0].min() - x0) < 12 and abs(line[:, :, 0].max() - x1) < 12
        assert abs(line[:, :, 1].min() - y0) < 12 and abs(line[:, :, 1].max() - y1) < 12
        lefts = line[:, 0, 0]
        assert (np.diff(lefts) > 0).all(), "boxes of one line come left to right"
    assert out["crops"].shape[0] == len(boxes) == len(out["crop_sizes"])


def test_boxes_of_a_photo_decoded_smaller_are_in_the_photos_own_pixels(
    recipes: dict[str, Recipe],
) -> None:
    """A 24 Mpx JPEG is decoded at 1/2 for OCR (4 Mpx is what it needs): its boxes must
    still come back in the pixels of the photo as sent, not of the smaller decode."""
    photo = np.full((4000, 6000, 3), 235, np.uint8)
    text = "Total 1284.50"
    cv2.putText(photo, text, (1800, 2600), cv2.FONT_HERSHEY_SIMPLEX, 6, (20, 20, 20), 14)
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 6, 14)
    blob = cv2.imencode(".jpg", photo, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    det_in = recipes["ocr_det_input"].run({"image_bytes": as_bytes(blob)})
    assert det_in["transform"].tolist()[4:] == [4000, 6000]
    maps = _ocr_session("ocr_det").run(None, {"x": det_in["x"]})[0]
    out = recipes["ocr_crops"].run(
        {"maps": maps, "image": det_in["image"], "transform": det_in["transform"]}
    )
    (box,) = out["boxes"]
    assert abs(box[:, 0].min() - 1800) < 40 and abs(box[:, 0].max() - (1800 + tw)) < 40
    assert abs(box[:, 1].min() - (2600 - th)) < 40 and abs(box[:, 1].max() - (2600 + base)) < 40


def test_no_text_gives_no_crops(recipes: dict[str, Recipe]) -> None:
    blank = np.full((200, 300, 3), 255, np.uint8)
    det_in = recipes["ocr_det_input"].run({"image_bytes": as_bytes(encode(blank))})
    maps = _ocr_session("ocr_det").run(None, {"x": det_in["x"]})[0]
    out = recipes["ocr_crops"].run(
        {"maps": maps, "image": det_in["image"], "transform": det_in["transform"]}
    )
    assert out["crops"].shape[0] == 0 and out["boxes"].shape == (0, 4, 2)


def rotate_only(recipes: dict[str, Recipe]) -> Recipe:
    """The rotation half of `ocr_rotate_rec_input`, keeping the crops to look at."""
    tensors = {
        "crops": {"datatype": "UINT8", "shape": [-1, -1, -1, 3]},
        "crop_sizes": {"datatype": "INT32", "shape": [-1, 2]},
        "boxes": {"datatype": "FP32", "shape": [-1, 4, 2]},
        "to_image": {"datatype": "FP32", "shape": [-1, 3, 3]},
    }
    declared = [{"name": n, **t} for n, t in tensors.items()]
    config = cfg.RecipeConfig.model_validate(
        {
            "inputs": [*declared, {"name": "probs", "datatype": "FP32", "shape": [-1, 2]}],
            "outputs": declared,
            "steps": [
                {"unpad": {"input": "crops", "sizes": "crop_sizes"}},
                {
                    "rotate_by_class": {
                        "probs": "probs",
                        "index": 1,
                        "threshold": 0.9,
                        "boxes": "boxes",
                        "to_image": "to_image",
                    }
                },
                {"stack_padded": {"output": "crops", "sizes_output": "crop_sizes"}},
            ],
        }
    )
    production = recipes["ocr_rotate_rec_input"].config.steps[1]
    assert config.steps[1] == production, "the same rotation as the OCR pipeline's"
    return Recipe("rotate", config, recipes["digits_input"].limits)


def test_rotate_turns_only_confident_upside_down_crops(recipes: dict[str, Recipe]) -> None:
    crop = np.zeros((10, 30, 3), np.uint8)
    crop[:, :5] = 255  # a bright band on the left
    crops = np.stack([crop, crop, crop])
    sizes = np.array([[10, 30]] * 3, np.int32)
    probs = np.array([[0.99, 0.01], [0.05, 0.95], [0.2, 0.8]], np.float32)
    boxes = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
    to_image = np.stack([np.eye(3, dtype=np.float32) + k for k in range(3)])
    out = rotate_only(recipes).run(
        {"crops": crops, "crop_sizes": sizes, "probs": probs, "boxes": boxes, "to_image": to_image}
    )
    turned = out["crops"]
    assert turned[0, :, :5].min() == 255, "class 0: unchanged"
    assert turned[1, :, -5:].min() == 255, "class 180 above 0.9: turned"
    assert turned[2, :, :5].min() == 255, "class 180 at 0.8: below threshold, unchanged"
    np.testing.assert_array_equal(out["boxes"], boxes)
    # The turned crop's pixel (x, y) is the unturned one's (30 - x, 10 - y).
    half_turn = np.array([[-1, 0, 30], [0, -1, 10], [0, 0, 1]], np.float32)
    np.testing.assert_allclose(out["to_image"], [to_image[0], to_image[1] @ half_turn, to_image[2]])


def test_an_upside_down_page_reads_backwards(recipes: dict[str, Recipe]) -> None:
    crops = np.stack([np.full((10, 30, 3), i * 50, np.uint8) for i in range(3)])
    sizes = np.array([[10, 30]] * 3, np.int32)
    probs = np.array([[0.01, 0.99], [0.02, 0.98], [0.9, 0.1]], np.float32)
    boxes = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
    to_image = np.stack([np.eye(3, dtype=np.float32) * (k + 1) for k in range(3)])
    out = rotate_only(recipes).run(
        {"crops": crops, "crop_sizes": sizes, "probs": probs, "boxes": boxes, "to_image": to_image}
    )
    np.testing.assert_array_equal(out["boxes"], boxes[::-1])
    assert [int(c[0, 0, 0]) for c in out["crops"]] == [100, 50, 0]
    assert [float(m[2, 2]) for m in out["to_image"]] == [3, 2, 1], "matrices follow crops"


def test_ctc_decode_merges_repeats_and_drops_blanks(recipes: dict[str, Recipe]) -> None:
    steps = ["a", "a", "", "a", "b", "b", "", "", "7", ""]  # "aab7"
    index = np.array([[CLASS[c] if c else 0 for c in steps]], np.int64)
    prob = np.where(index > 0, 0.9, 0.6).astype(np.float32)
    out = recipes["ocr_ctc_decode"].run(
        {"index": index, "prob": prob, "boxes": np.zeros((1, 4, 2), np.float32)}
    )
    assert out["text"].tolist() == [b"aab7"]
    assert out["score"][0] == pytest.approx(0.9)
    line = ctc_line(index[0], prob[0], None, ALPHABET, Spacing())
    assert (line.text, line.score) == ("aab7", pytest.approx(0.9))
    assert line.spans == [(0, 1), (3, 3), (4, 5), (8, 8)], "each character's steps"


def test_ctc_decode_gives_words_and_their_boxes_on_the_image(
    recipes: dict[str, Recipe],
) -> None:
    """Words are the text's runs between spaces; a word's box runs from its first step to
    the end of its last (a step: 8 px of the recogniser's input), widened by
    word_margin_steps (1.25 steps, 10 px) up to the middle of the gap to its neighbour and
    the line's end, spans the input's 48 px down, and is carried to the image by the
    line's matrix (here: twice the size, shifted by (100, 50))."""
    steps = "ab__cd_"
    index = np.array([[0 if c == "_" else CLASS[c] for c in steps]] * 2, np.int64)
    space = np.array([[0, 0, 0.9, 0, 0, 0, 0]] * 2, np.float32)
    to_image = np.array([[[2, 0, 100], [0, 2, 50], [0, 0, 1]]] * 2, np.float32)
    line = np.array([[100, 50], [220, 50], [220, 146], [100, 146]], np.float32)  # 60 px
    prob = np.array([[0.9] * 7, [0.1] * 7], np.float32)  # the second line drops (min_score)
    out = recipes["ocr_ctc_decode"].run(
        {
            "index": index,
            "prob": prob,
            "space": space,
            "boxes": np.stack([line, line]),
            "to_image": to_image,
        }
    )
    assert out["text"].tolist() == [b"ab cd"]
    assert out["words"].tolist() == [b"ab", b"cd"] and out["word_lines"].tolist() == [0, 0]
    # ab: steps 0-1, px 0-16, widened to 0 (the line's start) and 24 (the gap's middle);
    # cd: steps 4-5, px 32-48, widened to 24 and 58.
    np.testing.assert_allclose(
        out["word_boxes"],
        [
            [[100, 50], [148, 50], [148, 146], [100, 146]],
            [[148, 50], [216, 50], [216, 146], [148, 146]],
        ],
    )


def test_crops_carry_their_way_back_to_the_image(recipes: dict[str, Recipe]) -> None:
    """Each crop's matrix takes its corners to its box's corners on the original image; a
    tall crop is turned upright, its matrix with it."""
    for text, turn in (("Wide line 42", None), ("Tall", cv2.ROTATE_90_CLOCKWISE)):
        img = np.full((220, 420, 3), 255, np.uint8)
        cv2.putText(img, text, (40, 120), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 3)
        if turn is not None:
            img = np.ascontiguousarray(cv2.rotate(img, turn))
        det = recipes["ocr_det_input"].run({"image_bytes": as_bytes(encode(img))})
        maps = _ocr_session("ocr_det").run(None, {"x": det["x"]})[0]
        out = recipes["ocr_crops"].run(
            {"maps": maps, "image": det["image"], "transform": det["transform"]}
        )
        assert len(out["crop_sizes"]) == 1
        h, w = out["crop_sizes"][0]
        assert (w > h) and ((turn is None) == (img.shape[1] > img.shape[0]))
        corners = np.array([[0, 0, 1], [w, 0, 1], [w, h, 1], [0, h, 1]], np.float64)
        mapped = corners @ out["to_image"][0].astype(np.float64).T
        mapped = mapped[:, :2] / mapped[:, 2:]
        box = out["boxes"][0]
        # Clockwise from the crop's top-left: the box's own corners, rolled a quarter turn
        # for the tall one (its first corner is the text's start, not the image's top-left).
        expected = box if turn is None else np.roll(box, -1, axis=0)
        np.testing.assert_allclose(mapped, expected, atol=1.5)


def _line(recipes: dict[str, Recipe], steps: str, space: list[float]) -> str:
    """`steps`: one character a step, `_` the blank; `space`: the space's probability at
    each step."""
    index = np.array([[0 if c == "_" else CLASS[c] for c in steps]], np.int64)
    prob = np.full(index.shape, 0.9, np.float32)
    gaps = np.array([space], np.float32)
    out = recipes["ocr_ctc_decode"].run({"index": index, "prob": prob, "space": gaps})
    return out["text"][0].decode()


@pytest.mark.parametrize(
    ("steps", "space", "read"),
    [
        # The space's probability high between two characters: a word gap.
        ("ab_c", [0, 0, 0.7, 0], "ab c"),
        # Faint, but across a gap three blank steps wide (and wider than the line's usual
        # pitch): a word gap; the same faint probability in a narrow gap is not.
        ("a_b_c___de", [0, 0, 0, 0, 0, 0.03, 0.03, 0.03, 0, 0], "abc de"),
        ("a_b_c_de", [0, 0, 0, 0, 0, 0.03, 0, 0], "abcde"),
        # Nothing in the gap: no space, however wide.
        ("a_b_c___de", [0] * 10, "abcde"),
        # After a comma before a letter, a one-step gap is enough; not inside a number.
        ("ab,_c", [0] * 5, "ab, c"),
        ("3,_5", [0] * 4, "3,5"),
        # A code's hyphen stays on its letters unless the recogniser is sure.
        ("K_T___-4", [0, 0, 0, 0.05, 0.05, 0.05, 0, 0], "KT-4"),
    ],
)
def test_ctc_decode_finds_word_gaps(
    recipes: dict[str, Recipe], steps: str, space: list[float], read: str
) -> None:
    assert _line(recipes, steps, space) == read


def test_ctc_decode_checks_the_space_input(recipes: dict[str, Recipe]) -> None:
    with pytest.raises(InvalidInput, match="must be shaped as 'index'"):
        recipes["ocr_ctc_decode"].run(
            {
                "index": np.zeros((1, 5), np.int64),
                "prob": np.ones((1, 5), np.float32),
                "space": np.ones((1, 4), np.float32),
            }
        )


def test_ctc_decode_rejects_classes_outside_the_alphabet(recipes: dict[str, Recipe]) -> None:
    with pytest.raises(InvalidInput, match=r"outside this character list \(0..6624\)"):
        recipes["ocr_ctc_decode"].run(
            {"index": np.full((1, 5), 7000, np.int64), "prob": np.ones((1, 5), np.float32)}
        )
    with pytest.raises(InvalidInput, match="must both be"):
        recipes["ocr_ctc_decode"].run(
            {"index": np.zeros((1, 5), np.int64), "prob": np.ones((1, 4), np.float32)}
        )


FULL_COMMA, FULL_COLON, FULL_OPEN, FULL_CLOSE = "\uff0c", "\uff1a", "\uff08", "\uff09"
NI_HAO, SHI_JIE = "\u4f60\u597d", "\u4e16\u754c"


@pytest.mark.parametrize(
    ("read", "written"),
    [
        (f"preershee{FULL_COMMA}kiendbriest{FULL_COMMA} sist", "preershee,kiendbriest, sist"),
        (f"{FULL_OPEN}hello{FULL_CLOSE} a{FULL_COLON}b", "(hello) a:b"),
        # Chinese text keeps its full-width comma.
        (f"{NI_HAO}{FULL_COMMA}{SHI_JIE}", f"{NI_HAO}{FULL_COMMA}{SHI_JIE}"),
        (f"abc{FULL_COMMA}{NI_HAO}", f"abc{FULL_COMMA}{NI_HAO}"),
    ],
)
def test_full_width_punctuation_inside_latin_text_becomes_ascii(read: str, written: str) -> None:
    assert latin_punctuation(read) == written


def test_a_long_line_is_classified_through_windows(recipes: dict[str, Recipe]) -> None:
    """A line 30x longer than high reaches the direction classifier as windows of its own
    aspect (squeezed whole into 192 px it read as upside down half the time)."""
    img, _ = render_lines(["a long line of text that runs on and on, 0123456789 " * 2])
    det_in = recipes["ocr_det_input"].run({"image_bytes": as_bytes(encode(img))})
    maps = _ocr_session("ocr_det").run(None, {"x": det_in["x"]})[0]
    crops = recipes["ocr_crops"].run(
        {"maps": maps, "image": det_in["image"], "transform": det_in["transform"]}
    )
    (h, w), *_ = crops["crop_sizes"].tolist()
    assert w / h > 12
    cls_in = recipes["ocr_cls_input"].run(crops)["x"]
    assert cls_in.shape[0] > len(crops["crop_sizes"])  # several windows for the long line
    probs = _ocr_session("ocr_cls").run(None, {"x": cls_in})[0]
    assert probs[:, 0].mean() > 0.9  # upright, as drawn


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "is empty"),
        (b"not an image at all", "not a decodable image"),
        (
            b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj",
            r"is a PDF document \(send each page as an image\)",
        ),
        (encode(np.zeros((40, 40), np.uint8))[:60], "not a decodable image"),
        (encode(np.zeros((40, 40, 3), np.uint8), ".jpg")[:-40], "truncated JPEG"),
        (
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + (100000).to_bytes(4, "big") * 2 + b"\x08\x02",
            "more than the limit",
        ),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(8) + b"\x08\x02", "zero-size"),
    ],
)
def test_bad_images_are_named(recipes: dict[str, Recipe], blob: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as info:
        recipes["digits_input"].run({"image": as_bytes(blob)})
    assert "input 'image' element 0" in str(info.value)


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp", ".webp", ".tiff"])
def test_headers_declare_the_true_size(ext: str) -> None:
    img = np.zeros((37, 53, 3), np.uint8)
    assert media.declared_size(encode(img, ext)) == (53, 37)


def test_tiff_bomb_is_refused_from_its_header() -> None:
    import struct

    entries = [
        (256, 4, 1, 200_000),
        (257, 4, 1, 200_000),
        (258, 3, 1, 8),
        (259, 3, 1, 1),
        (262, 3, 1, 1),
        (273, 4, 1, 8),
        (277, 3, 1, 1),
        (278, 4, 1, 200_000),
        (279, 4, 1, 16),
    ]
    ifd = (
        struct.pack("<H", len(entries))
        + b"".join(struct.pack("<HHII", *e) for e in entries)
        + b"\x00" * 4
    )
    blob = b"II*\x00" + struct.pack("<I", 8 + 16) + b"\x00" * 16 + ifd
    with pytest.raises(InvalidInput, match="200000x200000"):
        images.decode(blob, "upload", images.ImageLimits())


def test_oversized_upload_is_rejected_before_decoding() -> None:
    limits = images.ImageLimits(max_encoded_bytes=1000)
    with pytest.raises(InvalidInput, match="more than the limit of 1000"):
        images.decode(b"\x00" * 1001, "upload", limits)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_escape_as_other_errors(blob: bytes) -> None:
    with contextlib.suppress(InvalidInput):
        images.decode(blob, "x", images.ImageLimits())


_PNG = encode(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
_JPG = encode(np.random.default_rng(1).integers(0, 255, (32, 32, 3), dtype=np.uint8), ".jpg")


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([_PNG, _JPG]),
    st.integers(0, 10_000),
    st.binary(min_size=1, max_size=8),
    st.booleans(),
)
def test_mutated_images_decode_or_fail_cleanly(
    base: bytes, at: int, patch: bytes, truncate: bool
) -> None:
    at %= len(base)
    blob = base[:at] if truncate else base[:at] + patch + base[at + len(patch) :]
    try:
        out = images.decode(blob, "x", images.ImageLimits())
        assert out.dtype == np.uint8 and out.ndim == 3
    except InvalidInput:
        pass


def _random_inputs(recipe: Recipe, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Tensors of the recipe's datatypes, in shapes near and far from what it expects."""
    from protos.codec import DATATYPE_TO_DTYPE

    inputs = {}
    for spec in recipe.inputs:
        if rng.random() < 0.05:
            continue  # a missing input
        shape = [
            d if d >= 0 and rng.random() < 0.7 else int(rng.choice([0, 1, 2, 3, 5, 48, 64]))
            for d in spec.shape
        ]
        if rng.random() < 0.1:
            shape = shape[:-1] or [1]  # a wrong rank
        if spec.datatype == "BYTES":
            items = [rng.bytes(int(rng.integers(0, 40))) for _ in range(int(np.prod(shape)))]
            array = np.empty(len(items), dtype=object)
            array[:] = items
            inputs[spec.name] = array.reshape(shape)
        else:
            scale = float(rng.choice([1, 255, 7000]))
            inputs[spec.name] = (rng.random(shape) * scale).astype(DATATYPE_TO_DTYPE[spec.datatype])
    return inputs


def test_every_recipe_refuses_odd_tensors_cleanly(recipes: dict[str, Recipe]) -> None:
    """Whatever tensors reach a recipe, it answers or raises InvalidInput (a 400), never
    another error (which a caller would see as INTERNAL)."""
    rng = np.random.default_rng(0)
    names = sorted(recipes)
    for _ in range(4000):
        recipe = recipes[names[int(rng.integers(len(names)))]]
        with contextlib.suppress(InvalidInput):
            recipe.run(_random_inputs(recipe, rng))


def test_a_line_wider_than_the_recogniser_takes_is_narrowed_to_its_limit(
    recipes: dict[str, Recipe],
) -> None:
    """A crop 250 times wider than high would be 12,000 wide at the recogniser's height;
    the recogniser takes 8192 at most (its memory grows with the square of the width), so
    that line is narrowed to 8192, its matrix back to the image says so, and a short line
    beside it keeps its own width."""
    crops = np.full((2, 20, 5000, 3), 255, np.uint8)
    crops[:, 5:15, ::50] = 0
    sizes = np.array([[20, 5000], [20, 100]], np.int32)
    out = recipes["ocr_rotate_rec_input"].run(
        {
            "crops": crops,
            "crop_sizes": sizes,
            "probs": np.tile(np.array([1, 0], np.float32), (5, 1)),  # 4 windows + 1: upright
            "boxes": np.zeros((2, 4, 2), np.float32),
            "to_image": np.tile(np.eye(3, dtype=np.float32), (2, 1, 1)),
        }
    )
    assert out["x"].shape == (2, 48, 8192, 3)
    assert out["widths"].tolist() == [8192, 320]  # 100 px at 48 high is 240: the minimum
    assert out["to_image"][0, 0, 0] == pytest.approx(5000 / 8192)
    assert out["to_image"][1, 0, 0] == pytest.approx(100 / 240)


def test_bounds_of_another_rank_than_the_shape_stop_the_file(tmp_path: Path) -> None:
    """A recipe's `max_shape` / `multiple_of` name each dimension of its input's shape: one
    of another length would bound the wrong dimensions, and is refused when the file loads."""
    bad = tmp_path / "recipes.yaml"
    bad.write_text(
        "recipes:\n  r:\n    inputs: [{name: i, datatype: FP32, shape: [-1, -1], "
        "max_shape: [1, 2, 3]}]\n"
        "    outputs: [{name: o, datatype: FP32, shape: [-1]}]\n"
        "    steps: [{color: {to: gray}}]\n"
    )
    with pytest.raises(cfg.RecipeFileError, match=r"max_shape \[1, 2, 3\] has 3 dimensions"):
        cfg.parse(bad)


def test_a_recipe_edited_is_told_apart_by_its_digest(tmp_path: Path) -> None:
    """A recipe's parameters edited keep its version and tensors: only the digest in its
    ModelConfig tells the proxy's caches that its outputs changed (v2server/triton.py)."""
    text = DEFAULT_RECIPES.read_text()
    edited = tmp_path / "recipes.yaml"
    edited.write_text(
        text.replace("crop_to_ink: {trim: 0.005}", "crop_to_ink: {trim: 0.01}").replace(
            "../models/", f"{DEFAULT_RECIPES.parent.parent}/models/"
        )
    )
    before, again = recipe_file.load(DEFAULT_RECIPES), recipe_file.load(DEFAULT_RECIPES)
    after = recipe_file.load(edited)
    assert before["digits_input"].digest == again["digits_input"].digest
    assert after["digits_input"].digest != before["digits_input"].digest
    assert after["ocr_det_input"].digest == before["ocr_det_input"].digest  # untouched
    # A `_file` parameter counts by its content, wherever the file is.
    assert after["ocr_ctc_decode"].digest == before["ocr_ctc_decode"].digest
    config = triton.model_config(ServedModel(after["digits_input"]))
    assert config.parameters[triton.DIGEST_PARAMETER].string_value == after["digits_input"].digest


def test_a_new_opencv_changes_every_recipes_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenCV decodes and resizes a little differently from release to release: a recipe
    run by another one is another model to the proxy's caches (a Redis cache outlives a
    rollout), though its file and the mesh's code are the same."""
    assert cv2.__version__ in recipe_file.LIBRARIES
    before = recipe_file.load(DEFAULT_RECIPES)
    monkeypatch.setattr(recipe_file, "LIBRARIES", recipe_file.LIBRARIES + "+next")
    after = recipe_file.load(DEFAULT_RECIPES)
    assert before.keys() == after.keys()
    assert all(after[name].digest != before[name].digest for name in before)


def test_a_recipe_that_decodes_says_how_small_in_its_config() -> None:
    """The proxy counts a pipeline's images in flight as the preprocessing decodes them,
    from the `min_pixels` a recipe's ModelConfig reports for its input of encoded images."""
    recipes = recipe_file.load(DEFAULT_RECIPES)
    said = {
        name: {
            k: p.string_value
            for k, p in triton.model_config(ServedModel(recipe)).parameters.items()
            if k.startswith(MIN_PIXELS_PARAMETER)
        }
        for name, recipe in recipes.items()
    }
    assert said["digits_input"] == {MIN_PIXELS_PARAMETER + "image": "500000"}
    assert said["ocr_det_input"] == {MIN_PIXELS_PARAMETER + "image_bytes": "4000000"}
    assert said["ocr_crops"] == {}  # takes tensors: nothing to decode
