"""Images decoded as a viewer shows them: the EXIF orientation of a JPEG, PNG or WebP turns
the pixels (OpenCV's IMREAD_UNCHANGED, kept for the alpha channel, ignores it), and a TIFF,
which OpenCV's decoder turns itself, is not turned twice."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from preprocess.images import ImageLimits, decode, decode_sized
from protos import media
from protos.decoded import decoded_pixels, reduction
from protos.errors import InvalidInput

FORMATS = {
    "JPEG": {"quality": 100},
    "PNG": {},
    "WEBP": {"lossless": True},
    "TIFF": {},
}


def tagged(image: Image.Image, fmt: str, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, fmt, exif=exif.tobytes(), **FORMATS[fmt])
    return out.getvalue()


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_orientation_decodes_as_pillow_shows_it(fmt: str) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    stored = Image.fromarray(pixels)
    for orientation in range(1, 9):
        data = tagged(stored, fmt, orientation)
        shown = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
        got = decode(data, "image 0", ImageLimits(), color="rgb")
        assert got.shape == shown.shape, (fmt, orientation)
        assert np.abs(got.astype(int) - shown).mean() < 3, (fmt, orientation)


def test_with_alpha_and_in_gray_too() -> None:
    """Turned after the alpha is flattened and whatever the colour layout asked for."""
    rgba = np.zeros((20, 50, 4), np.uint8)
    rgba[5:15, 2:10] = (0, 0, 0, 255)  # a black mark on the left of a transparent canvas
    data = tagged(Image.fromarray(rgba, "RGBA"), "PNG", 6)  # shown turned a quarter clockwise
    gray = decode(data, "image 0", ImageLimits(), color="gray")
    assert gray.shape == (50, 20)
    ink = np.argwhere(gray < 128)
    assert ink[:, 0].max() < 10 and ink[:, 1].min() >= 5  # now at the top, as shown


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(0, 200), noise=st.binary(min_size=0, max_size=64))
def test_torn_or_forged_exif_blocks_mean_as_stored(cut: int, noise: bytes) -> None:
    """A truncated or forged EXIF block never fails the image nor turns it at random."""
    data = tagged(Image.new("RGB", (8, 8)), "JPEG", 6)
    start = data.index(b"Exif\x00\x00") + 6
    forged = data[: start + cut] + noise + data[start + cut + len(noise) :]
    assert media.orientation(forged) in range(1, 9)
    assert media.orientation(data[: start + cut]) in range(1, 9)


def test_no_exif_block_is_as_stored() -> None:
    assert media.orientation(tagged(Image.new("RGB", (8, 8)), "JPEG", 1)) == 1
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "PNG")
    assert media.orientation(out.getvalue()) == 1
    assert media.orientation(b"\xff\xd8\xff") == 1


def test_a_multi_page_tiff_is_refused_naming_its_pages() -> None:
    """A scanner's three-page TIFF decoded to its first page: the other two pages' text was
    missing from the answer, unsaid. A page's thumbnail (a reduced-resolution IFD) is not a
    page."""
    pages = [Image.new("L", (40, 30), 255 - 60 * i) for i in range(3)]
    out = io.BytesIO()
    pages[0].save(out, "TIFF", save_all=True, append_images=pages[1:])
    assert media.tiff_pages(out.getvalue()) == 3
    with pytest.raises(InvalidInput, match="a TIFF of 3 pages, and only its first would be"):
        decode(out.getvalue(), "image 0", ImageLimits(), color="gray")
    one = io.BytesIO()
    pages[0].save(one, "TIFF")
    assert media.tiff_pages(one.getvalue()) == 1
    assert decode(one.getvalue(), "image 0", ImageLimits(), color="gray").shape == (30, 40)
    # A page and its thumbnail (an IFD marked a reduced-resolution copy): one page.
    assert media.tiff_pages(tiff_of([0, 1])) == 1
    assert media.tiff_pages(tiff_of([0, 1, 0, 1])) == 2
    assert decode(tiff_of([0, 1]), "image 0", ImageLimits(), color="gray").shape == (8, 8)
    # A chain of IFDs that loops back is walked once.
    looped = bytearray(tiff_of([0, 0]))
    second = int.from_bytes(looped[8 + 98 : 8 + 102], "little")
    looped[second + 98 : second + 102] = (8).to_bytes(4, "little")  # back to the first
    assert media.tiff_pages(bytes(looped)) == 2


def tiff_of(subfile_types: list[int]) -> bytes:
    """A little-endian TIFF of 8x8 grey images, one IFD each with its NewSubfileType."""
    out = bytearray(b"II*\x00") + (8).to_bytes(4, "little")
    for i, kind in enumerate(subfile_types):
        ifd = len(out)
        pixels = ifd + 2 + 12 * 8 + 4
        entries = [(254, 4, kind), (256, 3, 8), (257, 3, 8), (258, 3, 8), (259, 3, 1),
                   (262, 3, 1), (273, 4, pixels), (279, 4, 64)]  # fmt: skip
        out += len(entries).to_bytes(2, "little")
        for tag, kind_, value in entries:
            out += struct.pack("<HHII", tag, kind_, 1, value)
        last = i == len(subfile_types) - 1
        out += (0 if last else pixels + 64).to_bytes(4, "little")
        out += bytes([200]) * 64
    return bytes(out)


@pytest.mark.parametrize("color", ["rgb", "gray"])
def test_a_large_jpeg_decoded_smaller_is_turned_once_and_looks_the_same(color: str) -> None:
    """A JPEG decoded at 1/2-1/8 of its size (`min_pixels`) goes through OpenCV's colour
    decoder, which turns the image by its EXIF orientation itself unless told not to:
    every orientation must come out as the whole decode shows it, only smaller."""
    rng = np.random.default_rng(1)
    coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)  # smooth: survives scaling
    stored = Image.fromarray(np.asarray(Image.fromarray(coarse).resize((1600, 1200))))
    for orientation in range(1, 9):
        data = tagged(stored, "JPEG", orientation)
        whole = decode(data, "image 0", ImageLimits(), color=color)
        small, size = decode_sized(data, "image 0", ImageLimits(), color, min_pixels=100_000)
        assert small.shape[:2] == (whole.shape[0] // 4, whole.shape[1] // 4), orientation
        assert size == whole.shape[:2], orientation  # what boxes map back to
        assert small.ndim == whole.ndim
        shrunk = np.asarray(Image.fromarray(whole).resize(small.shape[1::-1], Image.BOX))
        assert np.abs(small.astype(int) - shrunk).mean() < 4, orientation


@pytest.mark.parametrize(
    ("width", "height", "min_pixels", "factor"),
    [
        (4032, 3024, 500_000, 4),  # a phone photo, for an 8x8 digit: 1008x756
        (4032, 3024, 4_000_000, 1),  # the same, for OCR's 4 Mpx: 1/2 would be 3 Mpx
        (8000, 6000, 4_000_000, 2),
        (8000, 6000, 0, 1),  # 0: always whole
        (800, 600, 500_000, 1),
        (100_000, 8, 1, 8),
    ],
)
def test_a_jpeg_is_decoded_smaller_only_while_the_pixels_asked_for_remain(
    width: int, height: int, min_pixels: int, factor: int
) -> None:
    assert reduction(width, height, min_pixels) == factor
    if factor > 1:
        assert (width // factor) * (height // factor) >= min_pixels


def test_only_jpegs_are_decoded_smaller() -> None:
    """PNG, WebP and the rest have no cheaper smaller decode: OpenCV would decode them
    whole and resize, which the steps after do better."""
    pixels = np.zeros((600, 800, 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    assert decode(out.getvalue(), "x", ImageLimits(), min_pixels=10_000).shape == (600, 800, 3)


@pytest.mark.parametrize("kind", ["baseline", "progressive", "png"])
@pytest.mark.parametrize("min_pixels", [0, 100_000, 500_000, 4_000_000])
def test_the_proxy_counts_the_pixels_the_decode_makes(kind: str, min_pixels: int) -> None:
    """The proxy counts an upload's pixels in flight (`max_inflight_mpx`) from its header and
    the decode's `min_pixels` (protos/decoded.py), before the preprocessing sees it: the
    count must be the decoded image's (a progressive JPEG, which holds all its coefficients,
    counted whole)."""
    import cv2

    image = np.full((1511, 2017), 200, np.uint8)  # odd sides: a reduced decode rounds up
    params = [cv2.IMWRITE_JPEG_PROGRESSIVE, 1] if kind == "progressive" else []
    data = cv2.imencode(".png" if kind == "png" else ".jpg", image, params)[1].tobytes()
    decoded = decode(data, "image 0", ImageLimits(), color="gray", min_pixels=min_pixels)
    counted = decoded_pixels(data, 2017, 1511, min_pixels)
    if kind == "progressive":
        assert counted == 2017 * 1511 >= decoded.size
    else:
        assert counted == decoded.size
    if kind == "baseline" and min_pixels == 100_000:
        assert counted == 505 * 378  # at 1/4


@pytest.fixture(scope="module")
def phone_photo_48mpx() -> dict[str, bytes]:
    """A photo in a phone's high-resolution mode (8000x6000) of a 7 on paper, as phones
    write it (baseline) and as an editor may re-save it (progressive)."""
    import cv2

    image = np.full((6000, 8000), 230, np.uint8)
    cv2.putText(image, "7", (3000, 4600), cv2.FONT_HERSHEY_SIMPLEX, 100, 30, 200)
    baseline = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    progressive = cv2.imencode(
        ".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    )[1].tobytes()
    return {"baseline": baseline, "progressive": progressive}


def test_a_photo_past_the_pixel_limit_is_read_when_decoded_smaller(
    phone_photo_48mpx: dict[str, bytes],
) -> None:
    """48 Mpx (a phone's high-resolution mode) is past the 40 Mpx limit on decoded images,
    which a whole decode of it would take (+276 MiB); decoded at 1/8 for the digits (0.5
    Mpx needed) or 1/2 for OCR (4 Mpx), libjpeg streams it. A progressive JPEG keeps all its
    coefficients while it decodes, whatever the scale, and is refused as before, saying so;
    so is a photo 4x past the limit (libjpeg still reads every block) and one whose steps
    need it whole."""
    limits = ImageLimits()
    digit = decode(phone_photo_48mpx["baseline"], "x", limits, "gray", min_pixels=500_000)
    assert digit.shape == (750, 1000)
    ink = np.argwhere(digit < 128)
    assert ink[:, 1].min() > 300 and ink[:, 0].max() < 600  # the 7, where it was drawn
    assert decode(phone_photo_48mpx["baseline"], "x", limits, min_pixels=4_000_000).shape == (
        3000,
        4000,
        3,
    )
    with pytest.raises(InvalidInput, match="a progressive JPEG holds all of its pixels"):
        decode(phone_photo_48mpx["progressive"], "x", limits, "gray", min_pixels=500_000)
    with pytest.raises(InvalidInput, match=r"more than the limit of 40000000$"):
        decode(phone_photo_48mpx["baseline"], "x", limits, "gray")
    with pytest.raises(InvalidInput, match=r"more than the limit of 40000000$"):
        decode(phone_photo_48mpx["baseline"], "x", limits, "gray", min_pixels=20_000_000)
    small = ImageLimits(max_pixels=10_000_000)
    with pytest.raises(InvalidInput, match="limit of 40000000 for a JPEG decoded at 1/8"):
        decode(phone_photo_48mpx["baseline"], "x", small, "gray", min_pixels=500_000)
