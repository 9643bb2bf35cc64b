"""Images built to cost a decoder gigabytes or minutes, through the whole mesh: each is
refused from its first bytes, and the mesh reads normal images meanwhile (issue 18)."""

from __future__ import annotations

import httpx
import pytest

from samples import hostile
from tests.conftest import Mesh
from tests.e2e.test_digits import held_out, png
from tests.hostile.probe import Watch
from tests.report import report

CASES = {
    **{f"{name} declaring 30000x30000": build for name, build in hostile.BOMBS.items()},
    "JPEG with 4,000 scans (145 KB, legal size)": hostile.scan_bomb,
    "JPEG whose header claims 6000x6000": hostile.forged_jpeg,
}
EXPECTED = {
    "gif": (415, "is GIF"),
    "hdr": (415, "is Radiance HDR"),
    "pnm": (415, "is PNM"),
    "sun_raster": (415, "is Sun raster"),
    "png": (400, "more than the limit of 40000000"),
    "bmp": (400, "more than the limit of 40000000"),
    "JPEG with": (400, "4000 scans, more than the limit of 40"),
    "JPEG whose": (400, "truncated or forged JPEG"),
}


@pytest.mark.parametrize("pipeline", ["digits", "ocr"])
def test_image_bombs_are_refused_from_their_first_bytes(mesh: Mesh, pipeline: str) -> None:
    pids = [mesh.local.procs[n].pid for n in ("proxy", "preprocess")]
    lines = []
    with httpx.Client(base_url=mesh.url, timeout=30) as client:
        for label, build in CASES.items():
            blob = build()
            with Watch(*pids) as watch:
                r = client.post(
                    f"/v1/pipelines/{pipeline}/infer",
                    content=blob,
                    headers={"Content-Type": "image/png"},
                )
            status, text = next(v for k, v in EXPECTED.items() if label.startswith(k))
            assert r.status_code == status, (label, r.text)
            assert text in r.json()["error"], (label, r.json())
            assert "Retry-After" not in r.headers
            cost = watch.cost
            assert cost.seconds < 2 and cost.cpu_s < 1 and cost.peak_growth_mb < 64, label
            lines.append(
                f"{label}: {r.status_code} in {cost.seconds * 1000:.0f} ms, {cost.cpu_s:.2f} s CPU"
            )
        ok = client.post(
            f"/v1/pipelines/{pipeline}/infer",
            content=png(held_out()[0][1]),
            headers={"Content-Type": "image/png"},
        )
    report(f"\nhostile images, `{pipeline}`: " + "; ".join(lines))
    assert ok.status_code == 200
