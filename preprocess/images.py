"""Decoding encoded images safely: format, size, pixel count and decoding cost checked
from the bytes before OpenCV allocates anything."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import cv2
import numpy as np

from protos import media
from protos.decoded import reduced, reduction
from protos.errors import InvalidInput
from protos.media import declared_size

# Errors only: a hostile image must not flood the log with decoder warnings.
cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)


@dataclass(frozen=True)
class ImageLimits:
    max_encoded_bytes: int = 20 * 1024 * 1024
    """Largest encoded image accepted."""
    max_pixels: int = 40_000_000
    """Largest width x height, read from the header before decoding."""
    max_jpeg_scans: int = 40
    """Most scans a (progressive) JPEG may have: each is a pass over the whole image, and
    a 1 MB file with thousands of empty ones took a minute of CPU. Encoders use 1-20."""
    max_decoded_bytes: int = 160_000_000
    """Largest image once decoded, from its header's pixels and sample layout: 16-bit and
    floating-point PNGs and TIFFs decode to 2-16 bytes a pixel (a 644 KB float TIFF of
    40 megapixels took 1 GB). Four bytes a pixel at `max_pixels`."""
    max_batch_bytes: int = 64 * 1024 * 1024
    """Largest batch a recipe makes (padded crops, the classifier's windows, the
    recogniser's lines), checked before it is allocated: small crops grow hundreds of times
    on the way (2,000 crops of 2x100, 1.4 MB, made a 691 MB recogniser batch). The
    services' largest message: a larger answer could not be sent anyway. A dense page of
    120 lines makes 48 MB."""
    decode_group_bytes: int = 32_000_000
    """A call's images are decoded and reduced together while their decoded size (from
    their headers) stays under this; past it, a few at a time (recipes.py)."""


JPEG_MIN_BYTES_PER_PIXEL = 1 / 4096
"""A JPEG must hold at least this many bytes per declared pixel. Even a uniform image
costs a bit per 8x8 block in its DC scan (1/512 byte per pixel; 1/170-1/255 measured for
uniform 4000x3000 images at any quality): a file far smaller than its header promises is
truncated or forged, and libjpeg would pad it with grey rather than fail (a 757-byte
file claiming 6000x6000 used to be classified)."""


def _check_jpeg(data: bytes, pixels: int, where: str, limits: ImageLimits) -> None:
    if not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
        raise InvalidInput(f"{where} is a truncated JPEG (no end-of-image marker)")
    if len(data) < pixels * JPEG_MIN_BYTES_PER_PIXEL:
        raise InvalidInput(
            f"{where} is a truncated or forged JPEG: {len(data)} bytes cannot hold the "
            f"{pixels} pixels its header declares"
        )
    # Inside a scan's entropy-coded data every 0xFF byte is followed by 0x00, so each
    # FF DA is a start-of-scan marker.
    scans = data.count(b"\xff\xda")
    if scans > limits.max_jpeg_scans:
        raise InvalidInput(
            f"{where} is a JPEG with {scans} scans, more than the limit of {limits.max_jpeg_scans}"
        )


def _to_8bit(img: np.ndarray) -> np.ndarray:
    """8 bits a sample, made without a temporary as wide as the image."""
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:  # native order (OpenCV's): each sample's high byte, as >> 8
        high = 1 if sys.byteorder == "little" else 0
        return np.ascontiguousarray(img.view(np.uint8)[..., high::2])
    return cv2.normalize(img, None, 0, 255, cv2.NORM_MINMAX, dtype=cv2.CV_8U)


UNIFORM_LEVELS = 8.0
"""Spread (standard deviation, grey levels) under which the opaque part is one colour."""


def _flatten_alpha(img: np.ndarray) -> np.ndarray:
    """Composite BGRA (or gray+alpha) over white, as a viewer shows it; except a drawing in
    one light colour on a transparent canvas (white strokes, made for a dark page: a
    drawing app's export), which goes over black: over white it would vanish ("no ink").
    Channel by channel in uint8 (OpenCV rounds and saturates): in float32 a 40-megapixel
    RGBA image took 1.9 GB and ~5 s."""
    *colour, alpha = cv2.split(img)
    white = _background_is_white(colour, alpha)
    flat = []
    for channel in colour:
        if white:  # 255 - (255 - c) * a / 255
            cv2.bitwise_not(channel, dst=channel)
            channel = cv2.multiply(channel, alpha, scale=1 / 255)
            cv2.bitwise_not(channel, dst=channel)
        else:  # c * a / 255
            channel = cv2.multiply(channel, alpha, scale=1 / 255)
        flat.append(channel)
    return flat[0] if len(flat) == 1 else cv2.merge(flat)


def _background_is_white(colour: list[np.ndarray], alpha: np.ndarray) -> bool:
    """False only for one light colour drawn on a partly transparent canvas."""
    opaque = cv2.compare(alpha, 128, cv2.CMP_GE)
    count = cv2.countNonZero(opaque)
    if count in (0, opaque.size):
        return True
    spread = [cv2.meanStdDev(channel, mask=opaque) for channel in colour]
    uniform = all(float(std[0, 0]) < UNIFORM_LEVELS for _, std in spread)
    light = np.mean([float(mean[0, 0]) for mean, _ in spread]) > 127.5
    return not (uniform and light)


def declared_bytes(data: bytes) -> int:
    """What the image will take decoded, from its header; 0 when the header does not say
    (decoding will refuse it)."""
    size = declared_size(data)
    return size[0] * size[1] * media.decoded_bytes_per_pixel(data) if size else 0


REDUCED = {
    (2, False): cv2.IMREAD_REDUCED_COLOR_2,
    (4, False): cv2.IMREAD_REDUCED_COLOR_4,
    (8, False): cv2.IMREAD_REDUCED_COLOR_8,
    (2, True): cv2.IMREAD_REDUCED_GRAYSCALE_2,
    (4, True): cv2.IMREAD_REDUCED_GRAYSCALE_4,
    (8, True): cv2.IMREAD_REDUCED_GRAYSCALE_8,
}
"""(factor, gray) -> OpenCV's flag for a JPEG decoded at 1/factor of its size."""


REDUCED_SOURCE_FACTOR = 4
"""A baseline JPEG decoded at 1/2 or smaller may declare this many times `max_pixels`:
libjpeg reads its blocks as a stream and keeps only the smaller image (a 48 Mpx photo, a
phone's high-resolution mode, at 1/2: +70 MiB and 171 ms; whole: +276 MiB and 378 ms).
What it decodes to stays within `max_pixels`."""


def decode(
    data: bytes, where: str, limits: ImageLimits, color: str = "bgr", min_pixels: int = 0
) -> np.ndarray:
    """Decode one encoded image to uint8 HWC (`bgr`, `rgb`) or HW (`gray`). A JPEG far
    larger than the `min_pixels` the steps after need is decoded at 1/2, 1/4 or 1/8 of its
    size (`reduction`), never below them."""
    return decode_sized(data, where, limits, color, min_pixels)[0]


def decode_sized(
    data: bytes, where: str, limits: ImageLimits, color: str = "bgr", min_pixels: int = 0
) -> tuple[np.ndarray, tuple[int, int]]:
    """`decode`, and the image's (height, width) as sent and shown (which a JPEG decoded
    smaller is not)."""
    if not data:
        raise InvalidInput(f"{where} is empty")
    if len(data) > limits.max_encoded_bytes:
        raise InvalidInput(
            f"{where} is {len(data)} bytes, more than the limit of {limits.max_encoded_bytes}"
        )
    kind = media.sniff(data)
    if kind is None:
        raise InvalidInput(
            f"{where} is {media.describe(data)}, not a decodable image "
            f"({media.accepted_names()} expected)"
        )
    size = declared_size(data)
    if size is None:
        name = media.ACCEPTED[kind]
        raise InvalidInput(f"{where} is not a decodable image: its {name} header is unreadable")
    w, h = size
    if w == 0 or h == 0:
        raise InvalidInput(f"{where} declares a zero-size image ({w}x{h})")
    factor = reduction(w, h, min_pixels) if kind == "jpeg" else 1
    most, why = limits.max_pixels, ""
    if factor > 1 and w * h > most:
        if media.jpeg_progressive(data):
            why = " (a progressive JPEG holds all of its pixels while it decodes)"
        else:
            most *= REDUCED_SOURCE_FACTOR
            why = f" for a JPEG decoded at 1/{factor}"
    if w * h > most:
        raise InvalidInput(
            f"{where} declares {w}x{h} = {w * h} pixels, more than the limit of {most}{why}"
        )
    depth = media.decoded_bytes_per_pixel(data)
    decoded = reduced(w, factor) * reduced(h, factor) * depth
    if decoded > limits.max_decoded_bytes:
        scaled = f" (at 1/{factor})" if factor > 1 else ""
        raise InvalidInput(
            f"{where} declares {w}x{h}{scaled} at {depth} bytes a pixel once decoded = {decoded} "
            f"bytes, more than the limit of {limits.max_decoded_bytes} (8 bits a sample fit)"
        )
    if kind == "jpeg":
        _check_jpeg(data, w * h, where, limits)
    if kind == "tiff" and (pages := media.tiff_pages(data)) > 1:
        # OpenCV decodes the first page only: the others' text would be missing, unsaid.
        raise InvalidInput(
            f"{where} is a TIFF of {pages} pages, and only its first would be read: send "
            "each page as an image of its own"
        )
    # A reduced decode is always colour or grey (a JPEG has no alpha), and would turn the
    # image by its EXIF orientation itself: `upright` does that, once, for every format.
    flag = (
        REDUCED[factor, color == "gray"] | cv2.IMREAD_IGNORE_ORIENTATION
        if factor > 1
        else cv2.IMREAD_UNCHANGED
    )
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    except cv2.error:
        img = None
    if img is None or img.size == 0:
        raise InvalidInput(
            f"{where} is not a decodable image (PNG, JPEG, BMP, WebP or TIFF expected)"
        )
    if img.shape[0] * img.shape[1] > limits.max_pixels:  # a header that told less than all
        raise InvalidInput(f"{where} has more than {limits.max_pixels} pixels")
    img = _to_8bit(img)
    if img.ndim == 3 and img.shape[2] in (2, 4):
        img = _flatten_alpha(img)
    turn = media.orientation(data)
    img = convert(upright(img, turn), color)
    if factor == 1:
        return img, img.shape[:2]
    return img, ((w, h) if turn in (5, 6, 7, 8) else (h, w))


def upright(img: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels as a viewer shows them, by their EXIF orientation: a phone photo taken
    sideways is stored sideways with a tag saying so, and its lines of text, read as stored,
    came out in the wrong order."""
    if orientation in (5, 7):  # across a diagonal: transposed first
        img = cv2.transpose(img)
    turn = {3: cv2.ROTATE_180, 6: cv2.ROTATE_90_CLOCKWISE, 7: cv2.ROTATE_180}
    flip = {2: 1, 4: 0}  # mirrored left-right, top-bottom
    if orientation == 8:
        return cv2.rotate(img, cv2.ROTATE_90_COUNTERCLOCKWISE)
    if orientation in turn:
        return cv2.rotate(img, turn[orientation])
    return cv2.flip(img, flip[orientation]) if orientation in flip else img


def convert(img: np.ndarray, color: str) -> np.ndarray:
    """Gray (HW) or BGR (HWC) to the wanted colour layout."""
    gray = img.ndim == 2 or img.shape[2] == 1
    if color == "gray":
        return img.reshape(img.shape[:2]) if gray else cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    bgr = cv2.cvtColor(img.reshape(img.shape[:2]), cv2.COLOR_GRAY2BGR) if gray else img
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB) if color == "rgb" else bgr
