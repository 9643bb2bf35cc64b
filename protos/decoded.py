"""What decoding an image will cost, told from its header before a byte of it is decoded.

Shared by the preprocessing, which decodes a JPEG far larger than its steps need at 1/2, 1/4
or 1/8 of its size (libjpeg scales inside its inverse DCT), and the proxy, which counts the
pixels a pipeline has in flight (`max_inflight_mpx`) as the preprocessing will decode them.
Counted as the header declares them, a phone's 12 Mpx photo took 12.2 of `digits`' 24 Mpx
though it is decoded at 1/4: a third of the requests of two clients sending such photos were
refused 503 (2026-12-01).
"""

from __future__ import annotations

from protos import media

MIN_PIXELS_PARAMETER = "mesh.decode_min_pixels."
"""A model's ModelConfig parameter `<this><input>`: the pixels its decode of that input keeps
at least (a recipe's `decode` `min_pixels`, v2server/triton.py). A model that does not report
it has its images counted whole."""


def reduction(w: int, h: int, min_pixels: int) -> int:
    """The largest of 8, 4, 2 a JPEG of w x h may be decoded smaller by while keeping
    `min_pixels` (libjpeg scales inside its inverse DCT: a 12 Mpx photo decoded in a quarter
    of the time at 1/2, a sixth at 1/4); 1 when none does (or `min_pixels` is 0)."""
    if min_pixels <= 0:
        return 1
    return next((f for f in (8, 4, 2) if (w // f) * (h // f) >= min_pixels), 1)


def reduced(side: int, factor: int) -> int:
    """A side decoded at 1/`factor`: libjpeg rounds up (2017 at 1/4: 505)."""
    return -(-side // factor)


def decoded_pixels(data: bytes, width: int, height: int, min_pixels: int) -> int:
    """The pixels an image of `width` x `height` (as its header declares) holds once decoded
    by a step asking for `min_pixels`: fewer for a baseline JPEG that `reduction` takes down.
    A progressive one is counted whole: libjpeg keeps all its coefficients while it decodes,
    whatever the scale."""
    factor = reduction(width, height, min_pixels)
    if factor == 1 or media.sniff(data) != "jpeg" or media.jpeg_progressive(data):
        return width * height
    return reduced(width, factor) * reduced(height, factor)
