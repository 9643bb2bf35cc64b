"""The shipped pipelines with their caches on (the suite's own mesh runs without them): a
repeated image is answered from the cache with the same answer (`digits` keeps it from its
second sighting, `ocr` from its first), and the preprocessing shared by `digits` and
`digits-partial` is done at most twice."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.mesh import free_port
from samples.images import text_samples
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out, png


def lookups(text: str) -> dict[tuple[str, str, str], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "proxy_cache_lookups_total":
                labels = sample.labels
                found[(labels["pipeline"], labels["step"], labels["result"])] = sample.value
    return found


def test_the_shipped_caches(mesh: Mesh) -> None:
    images, _ = held_out()
    digit = png(images[5])
    page = text_samples(1, seed=11)[0][0]
    with mesh.extra_proxy(free_port(), PROXY_CACHE="true") as url, mesh.client() as plain:
        with httpx.Client(base_url=url, timeout=60) as client:

            def post(pipeline: str, blob: bytes) -> httpx.Response:
                return client.post(
                    f"/v1/pipelines/{pipeline}/infer",
                    content=blob,
                    headers={"Content-Type": "image/png"},
                )

            first, second, third = (post("digits", digit) for _ in range(3))
            partial = post("digits-partial", digit)
            pages = [post("ocr", page), post("ocr", page)]
            counted = lookups(client.get("/metrics").text)
        uncached = plain.post(
            "/v1/pipelines/digits/infer", content=digit, headers={"Content-Type": "image/png"}
        )
    # admit: second: the first answer only makes the image known, the second is kept.
    assert [r.headers["X-Cache"] for r in (first, second, third)] == ["miss", "miss", "hit"]
    assert [r.json()["result"] for r in (first, second, third)] == [uncached.json()["result"]] * 3
    assert "X-Cache" not in uncached.headers  # PROXY_CACHE=false: no cache at all
    # digits-partial's own answer is computed, its preprocessing comes from digits' second.
    assert partial.headers["X-Cache"] == "miss"
    assert partial.json()["steps"][0] == {**partial.json()["steps"][0], "cache": "hit"}
    assert [r.headers["X-Cache"] for r in pages] == ["miss", "hit"]
    assert pages[1].json()["result"] == pages[0].json()["result"]
    assert counted[("digits", "", "hit")] == 1 and counted[("ocr", "", "hit")] == 1
    assert counted[("digits-partial", "preprocess", "hit")] == 1
