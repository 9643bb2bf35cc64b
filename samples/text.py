"""Text images as users send them: lines and pages in real fonts, photographed or scanned.

Words are made of syllables, with numbers, dates, prices and codes among them (the
recogniser has no language model, so made-up words are as hard as real ones). Glyphs that
the fonts draw alike (O and 0, I and l and 1) are left out so that an error is an error.
Fonts are the TrueType files that ship inside matplotlib's wheel (DejaVu Sans, Serif and
Mono, STIX, Computer Modern): real outline fonts, no download. A category fixes what
varies; everything is drawn from a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from samples.pixels import contrasting, encode
from samples.text_drawing import Look, WordBox, draw, drawn, fonts

__all__ = [
    "CATEGORIES",
    "Look",
    "Sample",
    "draw",
    "drawn",
    "fonts",
    "receipt",
    "sentence",
    "suite",
]

# ---------------------------------------------------------------- words

_ONSETS = "b c d f g h j k m n p r s t v w z br ch cr dr fr gr pr sh st th tr".split()  # noqa: SIM905
_VOWELS = "a e i u ai ea ou ee ie".split()  # noqa: SIM905
_CODAS = ["", "", "", "n", "r", "s", "t", "m", "nd", "st", "ck", "ng"]
_CAPITALS = "ABCDEFGHJKMNPQRSTUVWXYZ"


def _word(rng: np.random.Generator) -> str:
    syllables = int(rng.integers(1, 4))
    text = "".join(
        str(rng.choice(_ONSETS)) + str(rng.choice(_VOWELS)) + str(rng.choice(_CODAS))
        for _ in range(syllables)
    )
    return text.capitalize() if rng.random() < 0.15 else text


def _token(rng: np.random.Generator) -> str:
    kind = rng.random()
    if kind < 0.72:
        word = _word(rng)
        return word + str(rng.choice([",", ".", ":", "!", "?"])) if rng.random() < 0.12 else word
    if kind < 0.80:
        return f"{int(rng.integers(2, 9999))}"
    if kind < 0.86:
        return f"{int(rng.integers(2, 999))}.{int(rng.integers(10, 99))}"
    if kind < 0.91:
        return f"2026-{int(rng.integers(2, 13)):02d}-{int(rng.integers(2, 29)):02d}"
    code = "".join(rng.choice(list(_CAPITALS), int(rng.integers(2, 4))))
    return f"{code}-{int(rng.integers(2, 99))}"


def sentence(rng: np.random.Generator, words: tuple[int, int] = (2, 8)) -> str:
    return " ".join(_token(rng) for _ in range(int(rng.integers(*words))))


# ---------------------------------------------------------------- categories

Sampler = Callable[[np.random.Generator], Look]


def _line(low: int, high: int) -> Sampler:
    def sample(rng: np.random.Generator) -> Look:
        return Look(
            size=int(rng.integers(low, high + 1)),
            font=int(rng.integers(0, 1000)),
            margin=float(rng.uniform(0.2, 2.0)),
        )

    return sample


def _page(rng: np.random.Generator) -> Look:
    return Look(
        lines=int(rng.integers(3, 9)),
        size=int(rng.integers(14, 37)),
        font=int(rng.integers(0, 1000)),
        margin=float(rng.uniform(0.5, 3.0)),
        spacing=float(rng.uniform(1.3, 2.2)),
    )


def _few_lines(rng: np.random.Generator) -> Look:
    return replace(_page(rng), lines=int(rng.integers(1, 5)))


def _upside_down(rng: np.random.Generator) -> Look:
    return replace(_page(rng), lines=int(rng.integers(2, 7)), upside_down=True)


def _light_on_dark(rng: np.random.Generator) -> Look:
    dark = int(rng.integers(0, 60))
    light = int(rng.integers(190, 256))
    return replace(_few_lines(rng), ink=(light,) * 3, paper=(dark,) * 3)


def _noisy(rng: np.random.Generator) -> Look:
    return replace(_few_lines(rng), noise=float(rng.uniform(8, 25)))


def _blurred(rng: np.random.Generator) -> Look:
    return replace(_few_lines(rng), blur=float(rng.uniform(0.03, 0.07)))


def _jpeg(rng: np.random.Generator) -> Look:
    return replace(_few_lines(rng), jpeg=int(rng.integers(20, 50)))


def _perspective_look(rng: np.random.Generator) -> Look:
    return replace(_few_lines(rng), perspective=float(rng.uniform(0.02, 0.06)))


def _coloured(rng: np.random.Generator) -> Look:
    ink, paper = contrasting(rng, 90)
    return replace(_few_lines(rng), ink=ink, paper=paper)


def _gradient(rng: np.random.Generator) -> Look:
    """Paper whose colour changes across the image (light falling across a page)."""
    dark_ink = rng.random() < 0.7
    ink = tuple(int(v) for v in rng.integers(0, 60, 3)) if dark_ink else (250, 250, 250)
    lo, hi = (130, 256) if dark_ink else (0, 110)
    start = tuple(int(v) for v in rng.integers(lo, hi, 3))
    end = tuple(int(v) for v in rng.integers(lo, hi, 3))
    return replace(_few_lines(rng), ink=ink, paper=start, paper_to=end)  # type: ignore[arg-type]


def _photo(rng: np.random.Generator) -> Look:
    """A phone photo of a printed page: large, large text, lots of paper around it."""
    return replace(
        _page(rng),
        lines=int(rng.integers(4, 11)),
        size=int(rng.integers(40, 81)),
        margin=float(rng.uniform(2.0, 6.0)),
        perspective=float(rng.uniform(0, 0.02)),
        noise=float(rng.uniform(0, 6)),
        jpeg=int(rng.integers(70, 92)),
    )


def _everything(rng: np.random.Generator) -> Look:
    """A phone photo of a note: a bit of everything, milder."""
    ink, paper = contrasting(rng, 100)
    return replace(
        _few_lines(rng),
        size=int(rng.integers(12, 60)),
        ink=ink,
        paper=paper,
        perspective=float(rng.uniform(0, 0.03)),
        blur=float(rng.uniform(0, 0.04)),
        noise=float(rng.uniform(0, 10)),
        jpeg=int(rng.integers(40, 90)) if rng.random() < 0.6 else None,
    )


CATEGORIES: dict[str, Sampler] = {
    "line_small": _line(10, 16),
    "line_medium": _line(18, 40),
    "line_large": _line(45, 80),
    "page": _page,
    "upside_down": _upside_down,
    "light_on_dark": _light_on_dark,
    "noisy": _noisy,
    "blurred": _blurred,
    "jpeg": _jpeg,
    "perspective": _perspective_look,
    "coloured": _coloured,
    "gradient": _gradient,
    "photo": _photo,
    "everything": _everything,
}


@dataclass(frozen=True)
class Sample:
    category: str
    image: bytes
    lines: list[str]
    """The true lines, in reading order."""
    words: list[list[WordBox]] = field(default_factory=list)
    """Each line's words and where they are (samples/text_drawing.py)."""


def suite(per_category: int, seed: int = 0, categories: list[str] | None = None) -> list[Sample]:
    """`per_category` images of every category (or of the named ones)."""
    unknown = sorted(set(categories or ()) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"no text category {unknown} (there are: {', '.join(CATEGORIES)})")
    out = []
    for c, (name, sampler) in enumerate(CATEGORIES.items()):
        if categories is not None and name not in categories:
            continue
        rng = np.random.default_rng([seed, c])
        for _ in range(per_category):
            look = sampler(rng)
            text = [sentence(rng) for _ in range(look.lines)]
            image, words = drawn(text, look, rng)
            out.append(Sample(name, encode(image, look.jpeg), text, words))
    return out


def receipt(seed: int, lines: int = 200, size: int = 16) -> Sample:
    """A till receipt as a phone scans it: one narrow column of short lines (an item and
    its price), long enough that a page's long-side limit shrinks its text to a few
    pixels (200 lines of 16 px: ~450x4800). Not in the suite: it takes seconds to read."""
    rng = np.random.default_rng([seed, 1_000])
    text = [
        f"{sentence(rng, (1, 4))} {int(rng.integers(1, 99))}.{int(rng.integers(10, 99))}"
        for _ in range(lines)
    ]
    look = Look(lines=lines, size=size, font=int(rng.integers(0, 1000)), spacing=1.4)
    image, words = drawn(text, look, rng)
    return Sample("receipt", encode(image, None), text, words)


def write_folder(
    folder: Path, counts: dict[str, int], seed: int = 31
) -> dict[str, tuple[bytes, list[str]]]:
    """`counts[category]` images of each named category in a folder of its own under
    `folder`, PNG or JPEG as the category draws them; {path relative to `folder`: (image,
    true lines)}."""
    out: dict[str, tuple[bytes, list[str]]] = {}
    for category, count in counts.items():
        for i, sample in enumerate(suite(count, seed=seed, categories=[category])):
            suffix = "jpg" if sample.image[:2] == b"\xff\xd8" else "png"
            key = f"{category}/{i:04d}.{suffix}"
            (folder / key).parent.mkdir(parents=True, exist_ok=True)
            (folder / key).write_bytes(sample.image)
            out[key] = (sample.image, sample.lines)
    return out
