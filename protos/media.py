"""What an uploaded image is, by its first bytes: the formats the mesh decodes.

OpenCV decodes a dozen more (GIF, Radiance HDR, PNM, PFM, Sun raster, AVIF, JPEG 2000,
...), each a decoder whose header we would have to read to bound its cost: a 664 KB GIF
declaring 30000x30000 took 7 GB and 20 s. Only these five are let through; the proxy
answers 415 for anything else at the door, and the preprocess service refuses it again
before decoding (for callers that reach it directly).
"""

from __future__ import annotations

ACCEPTED = {"png": "PNG", "jpeg": "JPEG", "bmp": "BMP", "webp": "WebP", "tiff": "TIFF"}
"""Format key -> the name messages use."""

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)
_OTHERS = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"#?RADIANCE", "Radiance HDR"),
    (b"#?RGBE", "Radiance HDR"),
    (b"\x59\xa6\x6a\x95", "Sun raster"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"v/1\x01", "OpenEXR"),
    (b"PF", "PFM"),
    (b"Pf", "PFM"),
)


def sniff(data: bytes) -> str | None:
    """The accepted format `data` starts like ("png", "jpeg", ...), or None."""
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def describe(data: bytes) -> str:
    """A name for what `data` looks like, for messages about refused uploads."""
    kind = sniff(data)
    if kind is not None:
        return ACCEPTED[kind]
    for magic, name in _OTHERS:
        if data.startswith(magic):
            return name
    if data[:1] == b"P" and data[1:2] in b"1234567":
        return "PNM"
    if data[4:8] == b"ftyp":
        return "an ISO media file (AVIF/HEIF)"
    return "not a known image format"


def accepted_names() -> str:
    return ", ".join(ACCEPTED.values())
