"""Every hostile image is refused by the decoder's checks, before OpenCV sees it."""

from __future__ import annotations

import pytest

from preprocess.images import ImageLimits, decode
from protos.errors import InvalidInput
from samples import hostile


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (hostile.gif, "is GIF, not a decodable image"),
        (hostile.hdr, "is Radiance HDR"),
        (hostile.pnm, "is PNM"),
        (hostile.sun_raster, "is Sun raster"),
        (hostile.png, "30000x30000 = 900000000 pixels"),
        (hostile.bmp, "30000x30000 = 900000000 pixels"),
        (hostile.scan_bomb, "4000 scans, more than the limit of 40"),
        (hostile.forged_jpeg, "cannot hold the 36000000 pixels"),
    ],
)
def test_refused_with_the_reason(build, message: str) -> None:
    with pytest.raises(InvalidInput, match="upload") as info:
        decode(build(), "upload", ImageLimits())
    assert message in str(info.value)


def test_a_normal_progressive_jpeg_still_decodes() -> None:
    import cv2
    import numpy as np

    img = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok
    assert decode(buf.tobytes(), "upload", ImageLimits()).shape == (300, 400, 3)
