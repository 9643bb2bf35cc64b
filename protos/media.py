"""What an uploaded image is, by its first bytes: the formats the mesh decodes.

OpenCV decodes a dozen more (GIF, Radiance HDR, PNM, PFM, Sun raster, AVIF, JPEG 2000,
...), each a decoder whose header we would have to read to bound its cost: a 664 KB GIF
declaring 30000x30000 took 7 GB and 20 s. Only these five are let through; the proxy
answers 415 for anything else at the door, and the preprocess service refuses it again
before decoding (for callers that reach it directly).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

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
    (b"%PDF-", "a PDF document (send each page as an image)"),
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


# ---------------------------------------------------------------- declared sizes


def _png(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    return None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    frame = _jpeg_frame(data)
    return None if frame is None else frame[:2]


PROGRESSIVE_FRAMES = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
"""Start-of-frame markers of progressive JPEGs (Huffman or arithmetic, with or without
differential frames)."""


def jpeg_progressive(data: bytes) -> bool:
    """A progressive JPEG: libjpeg keeps all its coefficients while it decodes (2 bytes a
    sample, ~3 bytes a pixel in 4:2:0), whatever scale it decodes at."""
    frame = _jpeg_frame(data)
    return frame is not None and frame[2] in PROGRESSIVE_FRAMES


def _jpeg_frame(data: bytes) -> tuple[int, int, int] | None:
    """(width, height, start-of-frame marker) from a JPEG's first frame header."""
    for marker, pos, _ in _jpeg_segments(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return w, h, marker
    return None


def _jpeg_segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, position, length) of each segment of a JPEG before its first scan (the frame
    header and the metadata come before it); fill bytes and markers without a length are
    passed over."""
    if data[:2] != b"\xff\xd8":
        return
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            pos += 1 if marker == 0xFF else 2
            continue
        if marker == 0xDA:  # start of scan
            return
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        yield marker, pos, length
        pos += 2 + length


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


_TIFF_TAGS = {
    254: "subfile",
    256: "width",
    257: "height",
    258: "bits",
    262: "photometric",
    274: "orientation",
    277: "samples",
}


def _tiff_tags(data: bytes) -> dict[str, int] | None:
    """The first IFD's size and sample layout (each tag's first value), or None."""
    if data[:4] not in (b"II*\x00", b"MM\x00*") or len(data) < 8:
        return None
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", data[4:8])
    return _ifd(data, order, ifd)[0] if ifd + 2 <= len(data) else None


def tiff_pages(data: bytes, most: int = 64) -> int:
    """How many pages a TIFF holds (a scanner's or fax's multi-page document; IFDs marked
    as reduced-resolution copies of a page, thumbnails, not counted); 1 for other formats.
    OpenCV decodes the first page only."""
    if data[:4] not in (b"II*\x00", b"MM\x00*") or len(data) < 8:
        return 1
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", data[4:8])
    pages, seen = 0, set()
    while ifd >= 8 and ifd + 2 <= len(data) and ifd not in seen and len(seen) < most:
        seen.add(ifd)
        tags, ifd = _ifd(data, order, ifd)
        pages += not tags.get("subfile", 0) & 1
    return max(1, pages)


def _ifd(data: bytes, order: str, ifd: int) -> tuple[dict[str, int], int]:
    """One IFD's tags of `_TIFF_TAGS` (each one's first value), and where the next IFD
    starts (0: none)."""
    (count,) = struct.unpack(order + "H", data[ifd : ifd + 2])
    end = ifd + 2 + 12 * count
    following = data[end : end + 4]
    after = struct.unpack(order + "I", following)[0] if len(following) == 4 else 0
    tags: dict[str, int] = {}
    for i in range(min(count, 512)):
        entry = data[ifd + 2 + 12 * i : ifd + 14 + 12 * i]
        if len(entry) < 12:
            break
        tag, kind, values = struct.unpack(order + "HHI", entry[:8])
        name = _TIFF_TAGS.get(tag)
        if name is None or kind not in (3, 4):  # SHORT or LONG
            continue
        fmt = order + ("H" if kind == 3 else "I")
        width = struct.calcsize(fmt)
        where = entry[8:12]
        if values * width > 4:  # at an offset (BitsPerSample has one value a sample)
            (offset,) = struct.unpack(order + "I", where)
            where = data[offset : offset + width]
            if len(where) < width:
                continue
        (tags[name],) = struct.unpack(fmt, where[:width])
    return tags, after


def _tiff(data: bytes) -> tuple[int, int] | None:
    tags = _tiff_tags(data)
    if tags is None or "width" not in tags or "height" not in tags:
        return None
    return tags["width"], tags["height"]


def declared_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, JPEG, BMP, WebP or TIFF; None if unknown."""
    for reader in (_png, _jpeg, _bmp, _webp, _tiff):
        size = reader(data)
        if size is not None:
            return size
    return None


PNG_CHANNELS = {0: 1, 2: 3, 3: 4, 4: 2, 6: 4}
"""PNG colour type -> channels once decoded (a palette becomes BGR or BGRA)."""


def decoded_bytes_per_pixel(data: bytes) -> int:
    """Bytes each pixel takes once decoded as it is (OpenCV's IMREAD_UNCHANGED), from a PNG's
    or TIFF's header: 16-bit and floating-point samples, and up to four of them; 4 for the
    other formats (8-bit, at most BGRA) and for headers that do not say."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 26:
        depth, colour = data[24], data[25]
        return PNG_CHANNELS.get(colour, 4) * (2 if depth == 16 else 1)
    tags = _tiff_tags(data)
    if tags is None:
        return 4
    if tags.get("photometric") == 3:  # a palette: decoded as 8-bit BGR
        return 4
    bits = max(8, tags.get("bits", 8))
    return max(1, tags.get("samples", 1)) * -(-bits // 8)


# ---------------------------------------------------------------- orientation


def orientation(data: bytes) -> int:
    """The EXIF orientation (1-8; 1: as stored) of a JPEG (APP1), PNG (eXIf) or WebP (EXIF):
    how a phone's camera says to turn the pixels it stored sideways. Viewers and browsers
    honour it; OpenCV's IMREAD_UNCHANGED, which keeps the alpha channel, does not (except
    for a TIFF, whose decoder turns the image itself: 1 here)."""
    block = _exif(data)
    tags = _tiff_tags(block) if block else None
    value = tags.get("orientation", 1) if tags else 1
    return value if 1 <= value <= 8 else 1


def _exif(data: bytes) -> bytes | None:
    """The EXIF block (a TIFF header and its IFDs) of a JPEG, PNG or WebP, if it has one."""
    if data[:2] == b"\xff\xd8":
        return _jpeg_exif(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _chunk(data, 8, b"eXIf", b"IDAT", ">I", name_first=False)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        block = _chunk(data, 12, b"EXIF", b"", "<I", name_first=True)
        return block[6:] if block and block[:6] == b"Exif\x00\x00" else block
    return None


def _jpeg_exif(data: bytes) -> bytes | None:
    for marker, pos, length in _jpeg_segments(data):
        if marker == 0xE1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            return data[pos + 10 : pos + 2 + length]
    return None


def _chunk(
    data: bytes, pos: int, name: bytes, stop: bytes, size: str, name_first: bool
) -> bytes | None:
    """A PNG chunk (length, name, data, CRC) or RIFF chunk (name, length, data, padded to
    even) named `name`, looked for up to the chunk named `stop`."""
    while pos + 8 <= len(data):
        if name_first:
            found, (length,) = data[pos : pos + 4], struct.unpack(size, data[pos + 4 : pos + 8])
        else:
            (length,), found = struct.unpack(size, data[pos : pos + 4]), data[pos + 4 : pos + 8]
        if found == name:
            return data[pos + 8 : pos + 8 + length]
        if found == stop:
            return None
        pos += 8 + length + (length & 1 if name_first else 4)
    return None
