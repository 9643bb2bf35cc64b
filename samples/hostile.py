"""Small files that would cost a decoder a lot: bombs of every format OpenCV decodes,
scan bombs, forged headers. Each is built here from its format's rules, so the suite
needs nothing downloaded; sizes are what an attacker would send."""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np

SIDE = 30_000
"""What the bombs declare: 900 Mpx (2.7 GB as BGR)."""


def gif(side: int = SIDE) -> bytes:
    """A GIF whose screen and only frame are side x side, with a few bytes of LZW data."""
    screen = b"GIF89a" + struct.pack("<HHBBB", side, side, 0xF0, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, side, side, 0)
    lzw = b"\x02" + b"\x02\x4c\x01\x00"  # min code size 2, one tiny sub-block, end
    return screen + frame + lzw + b"\x3b"


def hdr(side: int = SIDE) -> bytes:
    header = b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y %d +X %d\n" % (side, side)
    return header + bytes(64)


def pnm(side: int = SIDE) -> bytes:
    return b"P6\n%d %d\n255\n" % (side, side) + bytes(64)


def sun_raster(side: int = SIDE) -> bytes:
    return struct.pack(">8I", 0x59A66A95, side, side, 24, side * side * 3, 1, 0, 0) + bytes(64)


def png(side: int = SIDE, depth: int = 8, colour: int = 2) -> bytes:
    """A PNG whose IHDR declares side x side (RGB by default), with one compressed row."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", side, side, depth, colour, 0, 0, 0)
    idat = zlib.compress(bytes(1 + 3 * 64))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def deep_png(side: int = 6000) -> bytes:
    """Within the pixel limit, but 16-bit RGBA: 8 bytes a pixel once decoded (288 MB)."""
    return png(side, depth=16, colour=6)


def float_tiff(side: int = 4000) -> bytes:
    """A little-endian TIFF declaring side x side RGB of 32-bit floats (12 bytes a pixel,
    192 MB decoded), its BitsPerSample at an offset as encoders write it, one strip."""
    entries = [  # tag, type (3 SHORT, 4 LONG), count, value or offset
        (256, 4, 1, side),
        (257, 4, 1, side),
        (258, 3, 3, 8 + 2 + 12 * 9 + 4),  # BitsPerSample: three values after the IFD
        (259, 3, 1, 8),  # Deflate
        (262, 3, 1, 2),  # RGB
        (273, 4, 1, 8 + 2 + 12 * 9 + 4 + 6),  # StripOffsets
        (277, 3, 1, 3),  # SamplesPerPixel
        (279, 4, 1, 64),  # StripByteCounts
        (339, 3, 1, 3),  # SampleFormat: IEEE float (the count says one for all samples)
    ]
    ifd = struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        packed = (
            struct.pack("<H", value) + bytes(2)
            if kind == 3 and count == 1
            else struct.pack("<I", value)
        )
        ifd += struct.pack("<HHI", tag, kind, count) + packed
    return (
        b"II*\x00"
        + struct.pack("<I", 8)
        + ifd
        + bytes(4)
        + struct.pack("<3H", 32, 32, 32)
        + bytes(64)
    )


def bmp(side: int = SIDE) -> bytes:
    header = struct.pack("<2sIHHI", b"BM", 54 + 64, 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, side, side, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return header + info + bytes(64)


def _jpeg(img: np.ndarray, progressive: bool = False) -> bytes:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)])
    assert ok
    return buf.tobytes()


def forged_jpeg(side: int = 6000) -> bytes:
    """A real 16x16 JPEG (757 bytes or so) whose frame header claims side x side; libjpeg
    pads the missing data with grey instead of failing."""
    data = bytearray(_jpeg(np.full((16, 16, 3), 200, np.uint8)))
    pos = 2
    while True:
        marker, length = data[pos + 1], struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if 0xC0 <= marker <= 0xC2:
            data[pos + 5 : pos + 9] = struct.pack(">HH", side, side)
            return bytes(data)
        pos += 2 + length


def scan_bomb(scans: int = 4000, side: int = 3000) -> bytes:
    """A legal-size progressive JPEG (side x side, under the pixel limit) with thousands
    of extra scans: its last scan, nearly empty for a flat image, repeated. Each scan is
    a pass over every coefficient of the image."""
    data = _jpeg(np.full((side, side, 3), 128, np.uint8), progressive=True)
    last = data.rfind(b"\xff\xda")
    scan = data[last:-2]  # SOS header + entropy-coded data, up to EOI
    repeats = max(1, scans - data.count(b"\xff\xda"))
    return data[:-2] + scan * repeats + b"\xff\xd9"


BOMBS = {
    "gif": gif,
    "hdr": hdr,
    "pnm": pnm,
    "sun_raster": sun_raster,
    "png": png,
    "bmp": bmp,
}
"""Images declaring 30000x30000 in a few hundred bytes, by format."""


def noisy_photo(seed: int, side: int = 2500) -> bytes:
    """A photo of a page as a phone saves it losslessly: sensor noise everywhere, so the PNG
    barely compresses (~17.7 MiB at 2500 x 2500, under the 20 MiB upload limit)."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    cv2.putText(img, f"invoice {seed}", (100, 400), cv2.FONT_HERSHEY_SIMPLEX, 8, (0, 0, 0), 20)
    return cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 1])[1].tobytes()


def huge_digit(side: int = 6000) -> bytes:
    """One handwritten-looking digit on a page photographed at 36 Mpx: mostly white, so the
    PNG is ~160 KiB, but it decodes to 108 MB (BGR)."""
    img = np.full((side, side, 3), 255, np.uint8)
    cv2.putText(
        img,
        "7",
        (side // 3, 2 * side // 3),
        cv2.FONT_HERSHEY_SIMPLEX,
        side / 60,
        (0, 0, 0),
        side // 40,
    )
    return cv2.imencode(".png", img)[1].tobytes()
