"""The recogniser's output as text: CTC's best path per line, word gaps found in the
recogniser's own per-step output (docs/accuracy.md has the measurements), and full-width
punctuation read inside Latin text made ASCII."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from preprocess.ocr_gaps import GapWeights, Ink, check_weights
from preprocess.ocr_words import Span, split_words, word_boxes
from preprocess.ops import checks, op
from preprocess.state import State
from protos.errors import InvalidInput

_CHARSETS: dict[Path, list[str]] = {}


def charset(path: Path) -> list[str]:
    """Index 0 is the CTC blank; the file's characters follow, then a space."""
    if path not in _CHARSETS:
        chars = path.read_text(encoding="utf-8").split("\n")
        if chars and chars[-1] == "":
            chars.pop()
        _CHARSETS[path] = ["", *chars, " "]
    return _CHARSETS[path]


@dataclass(frozen=True)
class Spacing:
    """Where a word gap is, from the recogniser's own output (measured on the generated
    suite, docs/accuracy.md): the recogniser (PP-OCRv4, trained mostly on Chinese text) rarely
    makes a space its best class, but its probability of a space rises at the steps between
    two words even when the blank wins. A step is 8 px of the line scaled to 48 px high, a
    sixth of the line's height, so gaps in steps are already in units of the line's size."""

    strong: float = 0.5
    """The space's probability somewhere between two characters at least this: a space."""
    weak: float = 0.01
    """At least this, and the gap wide too (`gap_steps`, `pitch`): a space."""
    gap_steps: int = 3
    """Blank steps between the two characters."""
    pitch: float = 1.0
    """The two characters' distance over the line's median distance between characters."""
    after_punctuation_steps: int = 1
    """After , : ; ! or ? and before a letter (or after ! ? before a digit), a gap of this
    many steps is a space: Latin text puts one there, and the recogniser's space
    probability stays low right after punctuation. 0: off."""


_PUNCTUATION = frozenset(",:;!?")


def _runs(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class, first step, last step) of each run of one non-blank class."""
    change = np.flatnonzero(idx[1:] != idx[:-1]) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change - 1, [len(idx) - 1]))
    cls = idx[starts]
    kept = cls != 0
    return cls[kept], starts[kept], ends[kept]


def _after_punctuation(before: str, previous: str, after: str) -> bool:
    if before not in _PUNCTUATION:
        return False
    if after.isalpha():
        return True
    # 3,5 and 12:30 are numbers; "Done!2026" is two words.
    return after.isdigit() and before in "!?" and not previous.isdigit()


class Line(NamedTuple):
    text: str
    score: float
    spans: list[Span]
    """Each character's first and last step (a space put in a word gap: (-1, -1))."""


def ctc_line(
    idx: np.ndarray,
    prob: np.ndarray,
    space: np.ndarray | None,
    chars: list[str],
    spacing: Spacing,
    ink: Ink | None = None,
) -> Line:
    """One line's best path: repeats merged, blanks dropped, and a space put in each word
    gap `spacing` finds (none without the space's probabilities: the recogniser's own
    spaces only); given the line's `ink`, each gap weighed by `ink.weights` instead.
    Score: the mean probability of the kept steps."""
    cls, starts, ends = _runs(idx)
    if not len(cls):
        return Line("", 0.0, [])
    score = float(np.mean(prob[starts]))
    space_class = len(chars) - 1
    spans = list(zip(starts.tolist(), ends.tolist(), strict=True))
    if space is None:
        return Line("".join(chars[c] for c in cls), score, spans)
    is_letter = cls != space_class
    letters = starts[is_letter]
    median = float(np.median(np.diff(letters))) if len(letters) > 1 else 1.0
    if ink is not None:
        text, kept = _spaced_by_ink(
            cls[is_letter], letters, ends[is_letter], median, space, chars, ink
        )
        return Line(text, score, kept)
    out, kept = [chars[cls[0]]], [spans[0]]
    for k in range(1, len(cls)):
        here = chars[cls[k]]
        if cls[k] != space_class and out[-1] != " ":
            gap = ends[k - 1] + 1, starts[k]
            likely = float(space[gap[0] : gap[1]].max()) if gap[1] > gap[0] else 0.0
            blanks = gap[1] - gap[0]
            wide = blanks >= spacing.gap_steps and starts[k] - starts[k - 1] >= (
                spacing.pitch * median
            )
            if (
                likely >= spacing.strong
                # A code's hyphen (KT-48) sits apart from the letter before it.
                or (likely >= spacing.weak and wide and here != "-")
                or (
                    spacing.after_punctuation_steps
                    and blanks >= spacing.after_punctuation_steps
                    and _after_punctuation(out[-1], out[-2] if len(out) > 1 else "", here)
                )
            ):
                out.append(" ")
                kept.append((-1, -1))
        out.append(here)
        kept.append(spans[k])
    return Line("".join(out), score, kept)


def _spaced_by_ink(
    cls: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    median: float,
    space: np.ndarray,
    chars: list[str],
    ink: Ink,
) -> tuple[str, list[Span]]:
    """The line's characters (`cls`: the recogniser's own spaces left out; `median`, their
    usual distance in steps) with a space in every gap `ink.weights` calls a word gap. The
    recogniser's spaces are judged like any other gap: on small text it puts them inside
    words, where the ink shows none."""
    if not len(cls):
        return "", []
    ink_gaps = ink.gaps(starts, ends)
    out, kept = [chars[cls[0]]], [(int(starts[0]), int(ends[0]))]
    for k in range(1, len(cls)):
        here = chars[cls[k]]
        gap = ends[k - 1] + 1, starts[k]
        features = GapWeights.features(
            likely=float(space[gap[0] : gap[1]].max()) if gap[1] > gap[0] else 0.0,
            blanks=int(gap[1] - gap[0]),
            pitch=float(starts[k] - starts[k - 1]) / median,
            after_punctuation=_after_punctuation(out[-1], out[-2] if len(out) > 1 else "", here),
            before=out[-1],
            after=here,
            ink_gap=float(ink_gaps[k - 1]),
        )
        if ink.weights.says_space(features):
            out.append(" ")
            kept.append((-1, -1))
        out.append(here)
        kept.append((int(starts[k]), int(ends[k])))
    return "".join(out), kept


def latin_punctuation(text: str) -> str:
    """Full-width forms (U+FF01..U+FF5E: comma U+FF0C, colon U+FF1A, ...) read inside
    Latin text become their ASCII twins. The recogniser knows both, as Chinese text uses
    the full-width ones, and after a Latin word it sometimes picks the full-width comma
    (seen on the generated suite); a full-width sign whose nearest characters on both
    sides are ASCII is the ASCII one."""
    if not any("\uff01" <= c <= "\uff5e" for c in text):
        return text
    chars = list(text)
    for i, c in enumerate(chars):
        if not "\uff01" <= c <= "\uff5e":
            continue
        before = text[:i].rstrip()[-1:]
        after = text[i + 1 :].lstrip()[:1]
        if all(n == "" or n.isascii() for n in (before, after)) and (before or after):
            chars[i] = chr(ord(c) - 0xFEE0)
    return "".join(chars)


@op
def ocr_ctc_decode(
    state: State,
    characters_file: str,
    index: str = "index",
    prob: str = "prob",
    space: str = "space",
    boxes: str = "boxes",
    to_image: str = "to_image",
    ink: str = "ink",
    ink_height: str = "ink_height",
    min_score: float = 0.5,
    space_strong: float = Spacing.strong,
    space_weak: float = Spacing.weak,
    space_gap_steps: int = Spacing.gap_steps,
    space_pitch: float = Spacing.pitch,
    space_after_punctuation_steps: int = Spacing.after_punctuation_steps,
    ink_gap_weights: dict[str, float] | None = None,
    word_margin_steps: float = 1.25,
    text_output: str = "text",
    score_output: str = "score",
    boxes_output: str = "boxes",
    words_output: str = "words",
    word_boxes_output: str = "word_boxes",
    word_lines_output: str = "word_lines",
) -> None:
    """Best class per step -> text and confidence per line (lines under min_score drop);
    with the space's probability per step (`space`, optional), word gaps (`space_*`: the
    fields of Spacing). The kept lines' words too, each with the line it is on and, given
    each line's matrix from the recogniser's input to the image (`to_image`, optional),
    its box (preprocess/ocr_words.py)."""
    chars = charset(Path(characters_file))
    idx, p = state.tensor(index), state.tensor(prob)
    if idx.ndim != 2 or p.shape != idx.shape:
        raise InvalidInput(
            f"inputs '{index}' {list(idx.shape)} and '{prob}' {list(p.shape)} must both be [N,T]"
        )
    gaps = state.tensors.get(space)
    if gaps is not None and gaps.shape != idx.shape:
        raise InvalidInput(f"input '{space}' {list(gaps.shape)} must be shaped as '{index}'")
    if idx.size and (idx.min() < 0 or idx.max() >= len(chars)):
        raise InvalidInput(
            f"input '{index}' holds classes outside this character list (0..{len(chars) - 1})"
        )
    box = state.tensors.get(boxes)
    if box is not None and box.shape[0] != len(idx):
        raise InvalidInput(f"input '{boxes}' has {box.shape[0]} boxes for {len(idx)} lines")
    frames = state.tensors.get(to_image)
    if frames is not None and frames.shape != (len(idx), 3, 3):
        raise InvalidInput(
            f"input '{to_image}' {list(frames.shape)} must be [{len(idx)},3,3] (one a line)"
        )
    rule = Spacing(
        space_strong, space_weak, space_gap_steps, space_pitch, space_after_punctuation_steps
    )
    inks = _inks(state, ink, ink_height, idx.shape, ink_gap_weights)
    decoded = [
        ctc_line(idx[i], p[i], None if gaps is None else gaps[i], chars, rule, inks[i])
        for i in range(len(idx))
    ]
    keep = [i for i, (text, score, _) in enumerate(decoded) if text and score >= min_score]
    texts = [latin_punctuation(decoded[i].text) for i in keep]
    state.tensors[text_output] = np.array([t.encode() for t in texts] or [], dtype=object)
    state.tensors[score_output] = np.array([decoded[i].score for i in keep], dtype=np.float32)
    line_boxes = (
        box[keep].reshape(-1, 4, 2).astype(np.float32)
        if box is not None
        else np.zeros((len(keep), 4, 2), np.float32)  # no boxes given: none to report
    )
    state.tensors[boxes_output] = line_boxes
    words, places, lines = [], [], []
    for row, (i, text) in enumerate(zip(keep, texts, strict=True)):
        found = split_words(text, decoded[i].spans)
        words += [w.text.encode() for w in found]
        lines += [row] * len(found)
        if frames is None:
            places.append(np.zeros((len(found), 4, 2), np.float32))
        else:
            edge = None if box is None else line_boxes[row]
            places.append(word_boxes(found, frames[i], edge, word_margin_steps))
    state.tensors[words_output] = np.array(words, dtype=object)
    state.tensors[word_boxes_output] = (
        np.concatenate(places) if places else np.zeros((0, 4, 2), np.float32)
    )
    state.tensors[word_lines_output] = np.array(lines, dtype=np.int32)


@checks("ocr_ctc_decode")
def _check_decode(params: dict) -> None:
    check_weights(params.get("ink_gap_weights"))


def _inks(
    state: State,
    columns: str,
    heights: str,
    shape: tuple[int, ...],
    weights: dict[str, float] | None,
) -> list[Ink | None]:
    """Each line's Ink when the recipe weighs gaps by it and the caller sent `columns` (UINT8
    [N,W]: the recogniser's input's columns, STEP_PX a step) and `heights` (FP32 [N])."""
    given = state.tensors.get(columns)
    if weights is None or given is None:
        return [None] * shape[0]
    tall = state.tensor(heights)
    if given.ndim != 2 or len(given) != shape[0]:
        raise InvalidInput(f"input '{columns}' {list(given.shape)} must be [{shape[0]}, W]")
    if tall.shape != (shape[0],):
        raise InvalidInput(f"input '{heights}' {list(tall.shape)} must be [{shape[0]}]")
    rule = GapWeights(**weights)
    return [Ink(given[i], float(tall[i]), rule) for i in range(shape[0])]
