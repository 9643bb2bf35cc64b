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
        (hostile.deep_png, "6000x6000 at 8 bytes a pixel once decoded"),
        (hostile.float_tiff, "4000x4000 at 12 bytes a pixel once decoded"),
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


def test_a_large_transparent_image_costs_a_few_times_its_pixels() -> None:
    """A 20-megapixel RGBA PNG is ~0.1 MB when mostly transparent. Composited in float32 it
    took ~11x its decoded size (a 40-megapixel one: 1.9 GB); channel by channel, ~3x."""
    import subprocess
    import sys

    from tests.procs import ROOT

    code = """
import resource, numpy as np, cv2
from preprocess.images import ImageLimits, decode
img = np.zeros((4000, 5000, 4), np.uint8)
img[1000:2000, 1000:4000] = (250, 250, 250, 255)
blob = cv2.imencode(".png", img)[1].tobytes()
del img
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = decode(blob, "upload", ImageLimits(), "bgr")
assert out.shape == (4000, 5000, 3) and out[1500, 1500, 0] == 250 and out[0, 0, 0] == 0
print(len(blob), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    upload, grown = (int(v) for v in done.stdout.split())
    decoded = 4000 * 5000 * 4
    assert upload < 1_000_000
    assert grown < 4 * decoded, f"decoding took {grown / 2**20:.0f} MiB more"


@pytest.mark.parametrize(("ext", "channels"), [(".png", 1), (".png", 4), (".tiff", 3)])
def test_deep_images_within_the_limit_decode_to_8_bits(ext: str, channels: int) -> None:
    """16-bit samples keep their high byte (as >> 8); a transparent one is laid over white."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(1)
    img = rng.integers(0, 65536, (120, 90, channels), dtype=np.uint16)
    if channels == 4:
        img[..., 3] = 65535  # opaque
    ok, buf = cv2.imencode(ext, img)
    assert ok
    out = decode(buf.tobytes(), "upload", ImageLimits())
    expected = (img >> 8).astype(np.uint8)
    if channels == 1:
        expected = np.repeat(expected, 3, axis=2)
    assert out.dtype == np.uint8 and np.array_equal(out, expected[..., :3])


def test_a_call_of_many_large_photos_holds_one_decoded_image_at_a_time() -> None:
    """A `digits_input` call of 12 digit photos of 4000x4000 (~80 KiB each as PNG, 48 MB
    decoded): decoded together, the call held every decoded image at once (+240 MiB here,
    2.3 GB for 64 photos of 36 Mpx); in groups under `decode_group_bytes`, about one. The
    answers are the same as each photo's alone."""
    import subprocess
    import sys

    from tests.procs import ROOT

    code = """
import resource, numpy as np
from preprocess import recipes
from preprocess.settings import DEFAULT_RECIPES
from samples import hostile
digits = recipes.load(DEFAULT_RECIPES)["digits_input"]
photos = [hostile.huge_digit(4000) for _ in range(12)]
batch = np.empty(12, object)
batch[:] = photos
alone = digits.run({"image": batch[:1]})["input"][0]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = digits.run({"image": batch})["input"]
assert out.shape == (12, 64) and np.array_equal(out, np.tile(alone, (12, 1)))
print(len(photos[0]), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    upload, grown = (int(v) for v in done.stdout.split())
    assert upload < 200_000
    assert grown < 3 * 4000 * 4000 * 3 // 2, f"the call took {grown / 2**20:.0f} MiB more"


async def test_a_small_upload_of_a_huge_image_is_not_decoded_on_the_event_loop() -> None:
    """Quick recipes on small requests run on the service's event loop (no thread hand-off).
    "Small" was the upload's size: a 16 KB bilevel PNG of 6000x6000 was decoded there and
    held the loop 0.76 s (every other call and health check waited). A recipe weighs its
    images as decoded (Recipe.work_bytes): that one goes to a worker thread, a small digit
    photo still runs on the loop."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import cv2
    import numpy as np

    from preprocess import recipes
    from preprocess.settings import DEFAULT_RECIPES
    from v2server.model import Scheduling
    from v2server.served import ServedModel

    page = np.full((6000, 6000), 255, np.uint8)
    cv2.putText(page, "7", (2000, 4000), cv2.FONT_HERSHEY_SIMPLEX, 100, 0, 150)
    bilevel = [cv2.IMWRITE_PNG_COMPRESSION, 9, cv2.IMWRITE_PNG_BILEVEL, 1]
    huge = cv2.imencode(".png", page, bilevel)[1].tobytes()
    small = cv2.imencode(".png", cv2.resize(page, (64, 64), interpolation=cv2.INTER_AREA))[1]
    assert len(huge) < 20_000

    # Any recipe counts as quick here (1 s), so only the weighing decides where a call runs:
    # with 10 ms, a slow CI machine's first decodes kept the small photo off the loop too.
    scheduling = Scheduling(
        instances=2, inline_below_s=1.0, inline_max_bytes=recipes.INLINE_MAX_BYTES
    )
    digits = recipes.load(DEFAULT_RECIPES, scheduling)["digits_input"]
    threads: list[str] = []
    run = digits.run

    def recorded(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        threads.append(threading.current_thread().name)
        return run(inputs)

    digits.run = recorded  # type: ignore[method-assign]
    served = ServedModel(digits, ThreadPoolExecutor(2))
    await served.start()
    try:
        for blob in [small.tobytes()] * 4 + [huge]:
            batch = np.empty(1, object)
            batch[0] = blob
            await served.infer({"image": batch}, None)
    finally:
        await served.stop()
    loop = threading.current_thread().name
    assert threads[3] == loop  # a small photo, once the recipe's time is known
    assert threads[4] != loop
