"""Load that used to cost the mesh more than it should: clients that hang up, a page
dense with words, and a crowd of large pages (issue 18)."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest

from protos import pb, pb_grpc
from samples import hostile, text
from samples.digits import suite as digit_suite
from samples.images import cer
from tests.conftest import Mesh
from tests.e2e.test_digits import held_out
from tests.hostile.probe import Watch
from tests.procs import metric_of
from tests.report import report

ALONE = pytest.mark.alone  # how the mesh holds under load: no other test beside it


def page(
    lines: int, size: int, words: tuple[int, int], side: int | None, seed: int
) -> tuple[bytes, list[str]]:
    rng = np.random.default_rng(seed)
    truth = [text.sentence(rng, words) for _ in range(lines)]
    img = text.draw(truth, text.Look(lines=lines, size=size, spacing=1.4, margin=1.0), rng)
    if side is not None:  # a photo of the page: lots of paper around it
        canvas = np.full((side, side, 3), 255, np.uint8)
        h, w = min(img.shape[0], side), min(img.shape[1], side)
        canvas[:h, :w] = img[:h, :w]
        img = canvas
    return text.encode(img, 85), truth


def executions(address: str, model: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=10)
    return sum(s.inference_stats.success.count for s in stats.model_stats)


@ALONE
def test_a_client_that_hangs_up_cancels_its_pipeline(mesh: Mesh) -> None:
    """The upload arrives, the client closes: the proxy cancels the calls in flight at
    once, no later step runs, and the request is recorded as 499, not 200."""
    blob, _ = page(30, 40, (6, 10), 2000, seed=1)
    rec = mesh.local.services["proxy"].env["PREDICTOR_OCR_REC_URL"]
    before = (
        executions(rec, "ocr_rec"),
        metric_of(mesh.url, "proxy_requests_total", pipeline="ocr", status="499"),
    )
    port = int(mesh.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/pipelines/ocr/infer HTTP/1.1\r\nHost: m\r\nContent-Type: image/jpeg\r\n"
            b"Content-Length: %d\r\n\r\n" % len(blob) + blob
        )
        time.sleep(0.2)  # the pipeline is under way (detection takes longer)
    time.sleep(3)
    after = (
        executions(rec, "ocr_rec"),
        metric_of(mesh.url, "proxy_requests_total", pipeline="ocr", status="499"),
    )
    report(
        f"\nhostile: a client hanging up mid-OCR: recogniser runs +{after[0] - before[0]}, "
        f"requests recorded 499 +{after[1] - before[1]:.0f}"
    )
    assert after[1] == before[1] + 1
    assert after[0] == before[0]


def test_a_page_of_a_thousand_words_is_read(mesh: Mesh) -> None:
    """Not `alone`: it bounds no time, and its 13 s of OCR can run beside the other worker.
    85 lines, 1,020 words: 340 classifier windows (the model takes 256 a call) went in
    one call, and an internal tensor passed the message limit: 429 before, never read."""
    blob, truth = page(85, 18, (12, 13), None, seed=2)
    with httpx.Client(base_url=mesh.url, timeout=60) as client:
        r = client.post(
            "/v1/pipelines/ocr/infer",
            content=blob,
            headers={"Content-Type": "image/jpeg", "X-Request-Timeout-Ms": "60000"},
        )
    assert r.status_code == 200, r.text[:500]
    lines = [line["text"] for line in r.json()["result"]["lines"]]
    errors, chars = cer(lines, truth)
    report(
        f"\nhostile: a page of {sum(len(t.split()) for t in truth)} words: "
        f"{len(lines)} lines read, CER {errors / chars:.4f}"
    )
    assert len(lines) == len(truth) and errors / chars < 0.02


@ALONE
def test_a_crowd_of_large_pages_is_shed_early(mesh: Mesh) -> None:
    """32 clients, two 3000x3000 pages each, against the 15 s budget (3 of 65 were answered
    in time and the proxy held 4.9 GB): the pipeline takes 24 megapixels at a time (two
    such pages), the rest get 503 + Retry-After at once, and what is taken is answered in
    time: as many pages as two cores read in the while, none of them late."""
    blobs = [page(20, 60, (4, 8), 3000, seed=10 + i)[0] for i in range(4)]
    answers: list[tuple[int, float, bool]] = []
    refusals: Counter[str] = Counter()

    def client(i: int) -> None:
        with httpx.Client(base_url=mesh.url, timeout=60) as c:
            for j in range(2):
                start = time.monotonic()
                r = c.post(
                    "/v1/pipelines/ocr/infer",
                    content=blobs[(i + j) % 4],
                    headers={"Content-Type": "image/jpeg"},
                )
                answers.append(
                    (r.status_code, time.monotonic() - start, "Retry-After" in r.headers)
                )
                if r.status_code == 503:
                    refusals[r.json()["error"].partition(" (")[0]] += 1

    with Watch(mesh.local.procs["proxy"].pid) as watch, ThreadPoolExecutor(32) as pool:
        list(pool.map(client, range(32)))
    statuses = sorted({s for s, _, _ in answers})
    ok = [t for s, t, _ in answers if s == 200]
    shed = [t for s, t, retry in answers if s == 503 and retry]
    report(
        f"\nhostile: 32 clients x 2 pages of 3000x3000: {len(answers)} answered "
        f"({ {s: sum(1 for a in answers if a[0] == s) for s in statuses} }), 200s in at most "
        f"{max(ok):.1f} s, 503s in at most {max(shed, default=0):.2f} s; proxy peak memory "
        f"+{watch.cost.peak_growth_mb:.0f} MiB; refused: {dict(refusals)}"
    )
    assert len(answers) == 64 and set(statuses) <= {200, 503}
    # A 503 is measured from the client's side, the upload of its 3000x3000 page by one of 32
    # httpx threads included, while two pages are read on both cores: 0.40 s alone,
    # 1.22 s once in a CI run on a machine ~2.5x slower than usual (both 2026-11-27).
    assert len(ok) >= 4 and max(ok) < 15 and max(shed) < 2
    assert watch.cost.peak_growth_mb < 1024


@ALONE
def test_a_crowd_of_uploads_at_once_stays_within_the_bytes_in_flight(mesh: Mesh) -> None:
    """64 clients upload a 17.7 MiB photo each, over ~1.5 s, all at once, to a proxy bound
    to 128 MiB in flight. Room was checked as each request started, and they all started
    together: 64 such uploads took a proxy bound to 256 MiB to 2 GiB. Now each upload counts
    as it arrives: every client gets an answer (200, or 503 + Retry-After: none reset), and
    the proxy's peak stays near its bound instead of holding all 64 bodies (1.1 GiB)."""
    photos = [hostile.noisy_photo(seed) for seed in range(4)]
    answers: Counter[int | str] = Counter()

    def paced(body: bytes) -> Iterator[bytes]:
        for start in range(0, len(body), 1 << 18):
            yield body[start : start + (1 << 18)]
            time.sleep(0.02)

    def client(i: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            try:
                r = c.post(
                    "/v1/pipelines/ocr/infer",
                    content=paced(photos[i % 4]),
                    headers={"Content-Type": "image/png", "X-Request-Timeout-Ms": "60000"},
                )
            except httpx.TransportError as exc:
                answers[type(exc).__name__] += 1
                return
            assert r.status_code == 200 or "Retry-After" in r.headers, r.text
            answers[r.status_code] += 1

    with mesh.extra_proxy(27980, PROXY_MAX_INFLIGHT_MB="128") as url:
        watch = Watch(mesh.extra_pids[url])
        with watch, ThreadPoolExecutor(64) as pool:
            list(pool.map(client, range(64)))
    report(
        f"\nhostile: 64 photos of 17.7 MiB uploaded at once, 128 MiB in flight: "
        f"{dict(answers)}, proxy peak memory +{watch.cost.peak_growth_mb:.0f} MiB"
    )
    assert sum(answers.values()) == 64 and set(answers) <= {200, 503}
    assert answers[200] >= 1 and answers[503] >= 1
    assert watch.cost.peak_growth_mb < 700  # all 64 bodies at once: 1,133 MiB, before copies


@ALONE
def test_a_crowd_of_huge_digit_photos_is_shed_before_the_preprocessing(mesh: Mesh) -> None:
    """32 clients at once, each a 6000x6000 photo of a digit (162 KiB, 108 MB decoded):
    the preprocessing decodes a merged call's images together, and these took it from 85 to
    1,341 MiB (its Kubernetes pod's limit: 640 Mi). `digits` takes 24 Mpx at a time; the
    rest get 503 + Retry-After at once, and the preprocessing stays within its pod."""
    photo = hostile.huge_digit()
    answers: Counter[int] = Counter()
    # A mesh in use has answered users' small digits first: the pace read from them (~1 ms
    # each, too little to refuse an arrival for) once let these photos wait unjudged, and
    # let in with their 3 s spent they timed out in the preprocessing (504, not 503).
    images, labels = held_out()
    usual = [s.image for s in digit_suite(images, labels, 8, seed=3)]
    with httpx.Client(base_url=mesh.url, timeout=60) as c, ThreadPoolExecutor(8) as pool:
        headers = {"Content-Type": "image/png"}
        done = pool.map(
            lambda b: c.post("/v1/pipelines/digits/infer", content=b, headers=headers), usual
        )
        assert all(r.status_code == 200 for r in done)

    def client(_: int) -> None:
        with httpx.Client(base_url=mesh.url, timeout=60) as c:
            r = c.post(
                "/v1/pipelines/digits/infer", content=photo, headers={"Content-Type": "image/png"}
            )
            assert r.status_code == 200 or "Retry-After" in r.headers, r.text
            answers[r.status_code] += 1

    watch = Watch(mesh.local.procs["preprocess"].pid)
    with watch, ThreadPoolExecutor(32) as pool:
        list(pool.map(client, range(32)))
    report(
        f"\nhostile: 32 digit photos of 6000x6000 at once: {dict(answers)}, preprocessing "
        f"peak memory +{watch.cost.peak_growth_mb:.0f} MiB"
    )
    assert set(answers) <= {200, 503} and answers[200] >= 1 and answers[503] >= 1
    assert watch.cost.peak_growth_mb < 500
