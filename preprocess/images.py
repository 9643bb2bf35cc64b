"""Decoding encoded images safely: format, size, pixel count and decoding cost checked
from the bytes before OpenCV allocates anything."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cv2
import numpy as np

from protos import media
from protos.errors import InvalidInput

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


JPEG_MIN_BYTES_PER_PIXEL = 1 / 4096
"""A JPEG must hold at least this many bytes per declared pixel. Even a uniform image
costs a bit per 8x8 block in its DC scan (1/512 byte per pixel; 1/170-1/255 measured for
uniform 4000x3000 images at any quality): a file far smaller than its header promises is
truncated or forged, and libjpeg would pad it with grey rather than fail (a 757-byte
file claiming 6000x6000 used to be classified)."""


def _png(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    return None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    if data[:2] != b"\xff\xd8":
        return None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            pos += 1 if marker == 0xFF else 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return w, h
        pos += 2 + length
    return None


def _bmp(data: bytes) -> tuple[int, int] | None:
    if data[:2] == b"BM" and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return abs(w), abs(h)
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP" or len(data) < 30:
        return None
    chunk = data[12:16]
    if chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return w, h
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def _tiff(data: bytes) -> tuple[int, int] | None:
    if data[:4] not in (b"II*\x00", b"MM\x00*") or len(data) < 8:
        return None
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", data[4:8])
    if ifd + 2 > len(data):
        return None
    (count,) = struct.unpack(order + "H", data[ifd : ifd + 2])
    size: dict[int, int] = {}
    for i in range(min(count, 512)):
        entry = data[ifd + 2 + 12 * i : ifd + 14 + 12 * i]
        if len(entry) < 12:
            break
        tag, kind = struct.unpack(order + "HH", entry[:4])
        if tag in (256, 257):  # ImageWidth, ImageLength: SHORT or LONG
            fmt = order + ("H" if kind == 3 else "I")
            (size[tag],) = struct.unpack(fmt, entry[8 : 8 + struct.calcsize(fmt)])
    return (size[256], size[257]) if len(size) == 2 else None


def declared_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, JPEG, BMP, WebP or TIFF; None if unknown."""
    for reader in (_png, _jpeg, _bmp, _webp, _tiff):
        size = reader(data)
        if size is not None:
            return size
    return None


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
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:
        return (img >> 8).astype(np.uint8)
    return cv2.normalize(img, None, 0, 255, cv2.NORM_MINMAX).astype(np.uint8)


def _flatten_alpha(img: np.ndarray) -> np.ndarray:
    """Composite BGRA (or gray+alpha) over white, as a viewer shows it."""
    alpha = img[..., -1:].astype(np.float32) / 255.0
    color = img[..., :-1].astype(np.float32)
    return (color * alpha + 255.0 * (1.0 - alpha)).round().astype(np.uint8)


def decode(data: bytes, where: str, limits: ImageLimits, color: str = "bgr") -> np.ndarray:
    """Decode one encoded image to uint8 HWC (`bgr`, `rgb`) or HW (`gray`)."""
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
    if w * h > limits.max_pixels:
        raise InvalidInput(
            f"{where} declares {w}x{h} = {w * h} pixels, more than the limit of {limits.max_pixels}"
        )
    if kind == "jpeg":
        _check_jpeg(data, w * h, where, limits)
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
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
    return convert(img, color)


def convert(img: np.ndarray, color: str) -> np.ndarray:
    """Gray (HW) or BGR (HWC) to the wanted colour layout."""
    gray = img.ndim == 2 or img.shape[2] == 1
    if color == "gray":
        return img.reshape(img.shape[:2]) if gray else cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    bgr = cv2.cvtColor(img.reshape(img.shape[:2]), cv2.COLOR_GRAY2BGR) if gray else img
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB) if color == "rgb" else bgr
