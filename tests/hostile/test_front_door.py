"""The proxy's front door against rude clients: every byte, header and second bounded
before it is spent (issue 18). Real processes (the shared `mesh`), raw sockets."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson

from tests.conftest import Mesh
from tests.e2e.test_digits import held_out, png
from tests.hostile.probe import Watch, exchange, health_watched
from tests.report import report

MB = 1 << 20


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def head(path: str = "/v1/pipelines/digits/infer", **headers: str) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"POST {path} HTTP/1.1\r\nHost: mesh\r\n{lines}".encode()


def digit() -> bytes:
    return png(held_out()[0][3])


def digits_ok(url: str, count: int = 4) -> list[int]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return [
            client.post(
                "/v1/pipelines/digits/infer", content=digit(), headers={"Content-Type": "image/png"}
            ).status_code
            for _ in range(count)
        ]


def test_giant_headers_are_refused_after_32_kib(mesh: Mesh) -> None:
    """Four clients each start a 64 MB header (parsing one used to take the proxy's event
    loop 21 s); the proxy answers 431 at 32 KiB and keeps serving everyone else."""
    port = port_of(mesh.url)
    giant = [head() + b"X-Junk: "] + [b"a" * 65536] * 1024  # 64 MiB offered
    slow: list[float] = []

    def health_while() -> None:
        with httpx.Client(base_url=mesh.url, timeout=10) as client:
            for _ in range(10):
                start = time.monotonic()
                client.get("/healthz")
                slow.append(time.monotonic() - start)

    with Watch(mesh.local.procs["proxy"].pid) as watch:
        checker = threading.Thread(target=health_while)
        checker.start()
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: exchange(port, giant), range(4)))
        checker.join()
    report(
        f"\nhostile: 4 x 64 MiB header: {[a[0] for a in answers]} in at most "
        f"{max(a[2] for a in answers):.2f} s; proxy CPU {watch.cost.cpu_s:.2f} s, peak memory "
        f"+{watch.cost.peak_growth_mb:.0f} MiB; /healthz meanwhile at most {max(slow):.3f} s"
    )
    assert [a[0] for a in answers] == [431] * 4
    assert b"request head over 32768 bytes" in answers[0][1]
    assert max(a[2] for a in answers) < 5 and max(slow) < 1
    assert watch.cost.cpu_s < 2 and watch.cost.peak_growth_mb < 64
    assert digits_ok(mesh.url) == [200] * 4


def test_too_many_header_lines_are_refused(mesh: Mesh) -> None:
    lines = b"".join(b"X-%d: 1\r\n" % i for i in range(500))
    status, answer, _ = exchange(port_of(mesh.url), [head() + lines + b"\r\n"])
    assert status == 431 and b"more than 100 header lines" in answer


def test_a_head_sent_slowly_is_cut_off(mesh: Mesh) -> None:
    with mesh.extra_proxy(28181, PROXY_HEAD_TIMEOUT_S="1") as url:
        parts = [head()] + [b"X-Slow: 1\r\n"] * 30
        status, answer, seconds = exchange(port_of(url), parts, pause=0.2)
    report(f"\nhostile: a head trickled over 6 s, 1 s allowed: {status} after {seconds:.1f} s")
    assert status == 408 and b"not complete within 1 s" in answer
    assert seconds < 3


def test_slow_bodies_take_no_pipeline_slot_and_are_cut_off(mesh: Mesh) -> None:
    """Ten clients send their upload at a byte a second to a proxy that serves two
    requests at once; everyone else is served, and each trickler gets 408 once its rate
    falls under the floor (after a 2 s grace)."""
    with mesh.extra_proxy(28182, PROXY_MAX_IN_FLIGHT="2") as url:
        port = port_of(url)
        slow_head = head(**{"Content-Type": "image/png", "Content-Length": "5000"}) + b"\r\n"
        parts = [slow_head] + [b"\x89"] * 20
        with ThreadPoolExecutor(10) as pool:
            tricklers = [pool.submit(exchange, port, parts, pause=1.0) for _ in range(10)]
            time.sleep(0.5)
            served = digits_ok(url, 8)
            answers = [t.result() for t in tricklers]
    report(
        f"\nhostile: 10 uploads at 1 byte/s, 2 pipeline slots: others {served}; tricklers "
        f"{sorted({a[0] for a in answers})} after at most {max(a[2] for a in answers):.1f} s"
    )
    assert served == [200] * 8
    assert [a[0] for a in answers] == [408] * 10
    assert all(b"slower than" in a[1] for a in answers)
    assert max(a[2] for a in answers) < 6


def _chunked(body_head: bytes, total: int, piece: int = MB) -> list[bytes]:
    chunk = b"%x\r\n" % piece + b"\x00" * piece + b"\r\n"
    return [body_head] + [chunk] * (total // piece) + [b"0\r\n\r\n"]


def test_bodies_over_the_limit_are_refused_while_arriving(mesh: Mesh) -> None:
    """Every path: a declared length, a chunked raw upload, a chunked multipart upload
    (once buffered whole: 1.1 GB in memory + 1 GB on disk), v2 JSON with and without a
    length. None may make the proxy hold much more than the 20 MiB limit."""
    port = port_of(mesh.url)
    v2 = "/v2/models/digits_mlp/infer"
    multipart = (
        head(**{"Content-Type": "multipart/form-data; boundary=b", "Transfer-Encoding": "chunked"})
        + b"\r\n"
    )
    cases = {
        "raw, Content-Length 300 MB": [
            head(**{"Content-Type": "image/png", "Content-Length": str(300 * MB)}) + b"\r\n"
        ],
        "raw, chunked 200 MB": _chunked(
            head(**{"Content-Type": "image/png", "Transfer-Encoding": "chunked"}) + b"\r\n",
            200 * MB,
        ),
        "multipart, chunked 200 MB": _chunked(multipart, 200 * MB),
        "v2 JSON, Content-Length 300 MB": [
            head(v2, **{"Content-Type": "application/json", "Content-Length": str(300 * MB)})
            + b"\r\n"
        ],
        "v2 JSON, chunked 200 MB": _chunked(
            head(v2, **{"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
            + b"\r\n",
            200 * MB,
        ),
    }
    results = {}
    for label, parts in cases.items():
        with Watch(mesh.local.procs["proxy"].pid) as watch:
            status, answer, seconds = exchange(port, parts)
        results[label] = (status, seconds, watch.cost.peak_growth_mb)
        assert status == 413, (label, answer[:300])
        assert b"Connection: close" in answer or b"connection: close" in answer, label
    report(
        "\nhostile: bodies over 20 MiB: "
        + "; ".join(
            f"{k}: {s} in {t:.2f} s, proxy peak +{m:.0f} MiB" for k, (s, t, m) in results.items()
        )
    )
    assert max(r[2] for r in results.values()) < 96
    assert digits_ok(mesh.url) == [200] * 4


def test_v2_json_that_would_allocate_gigabytes_is_a_400(mesh: Mesh) -> None:
    """The 88-byte request whose BYTES element was an integer (2.9 GB, then 429)."""
    tiny = orjson.dumps(
        {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [1500000000]}]}
    )
    with Watch(mesh.local.procs["proxy"].pid) as watch, httpx.Client(base_url=mesh.url) as c:
        r = c.post("/v2/models/digits_input/infer", content=tiny)
    report(
        f"\nhostile: {len(tiny)}-byte v2 JSON with an integer BYTES element: {r.status_code} in "
        f"{watch.cost.seconds:.3f} s, proxy peak +{watch.cost.peak_growth_mb:.0f} MiB"
    )
    assert r.status_code == 400 and "BYTES elements must be strings" in r.json()["error"]
    assert "Retry-After" not in r.headers and watch.cost.peak_growth_mb < 16


def test_malformed_v2_json_leaves_the_connection_usable(mesh: Mesh) -> None:
    good = {
        "inputs": [
            {
                "name": "input",
                "shape": [1, 64],
                "datatype": "FP32",
                "data": [float(v) for v in held_out()[0][0].reshape(-1)],
            }
        ]
    }
    bad = [
        {"inputs": [{"name": {"a": 1}, "shape": [1], "datatype": "FP32", "data": [1]}]},
        {"inputs": [{"name": "input", "shape": [1], "datatype": ["FP32"], "data": [1]}]},
        {**good, "outputs": 5},
        {"inputs": [{"name": "input", "shape": [0, 10**12], "datatype": "FP32", "data": []}]},
    ]
    with httpx.Client(base_url=mesh.url, timeout=10) as client:  # one keep-alive connection
        for body in bad:
            r = client.post("/v2/models/digits_mlp/infer", json=body)
            assert r.status_code == 400, (body, r.text)
            after = client.post("/v2/models/digits_mlp/infer", json=good)
            assert after.status_code == 200, after.text
            assert after.json()["outputs"][0]["name"] in ("label", "probabilities")


def test_large_v2_bodies_leave_the_event_loop_free(mesh: Mesh) -> None:
    """v2 REST bodies under the 20 MiB limit once held the proxy's event loop 2-3 s each (a
    long number list, binary BYTES, base64), and 4 M binary BYTES elements forwarded to
    `digits_input` took the proxy to 1.3 GB. Now shapes are checked against the model
    (max_batch_size included) before the data is decoded, and large bodies parse beside
    the loop."""
    count = 4_000_000
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [count],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 4 * count},
                }
            ]
        }
    )
    bodies = {
        "binary BYTES to digits_input": (
            "/v2/models/digits_input/infer",
            header + b"\x00" * (4 * count),
            {"Inference-Header-Content-Length": str(len(header))},
        ),
        "a 16 MiB number list to digits_mlp": (
            "/v2/models/digits_mlp/infer",
            orjson.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "shape": [1, 64],
                            "datatype": "FP32",
                            "data": [[0.5] * 64] + [[1.25] * 64] * 55_000,
                        }
                    ]
                }
            ),
            {},
        ),
        "16 MiB of base64 to the digits pipeline": (
            "/v2/models/digits/infer",
            orjson.dumps(
                {
                    "inputs": [
                        {
                            "name": "image",
                            "shape": [1],
                            "datatype": "BYTES",
                            "parameters": {"content_type": "base64"},
                            "data": ["QUFB" * (4 * MB)],
                        }
                    ]
                }
            ),
            {},
        ),
    }
    for what, (path, body, headers) in bodies.items():
        proxy = mesh.local.procs["proxy"].pid
        with (
            health_watched(mesh.url) as slowest,
            Watch(proxy) as watch,
            httpx.Client(timeout=30) as c,
        ):
            r = c.post(mesh.url + path, content=body, headers=headers)
        report(
            f"\nhostile: v2 REST, {what} ({len(body) / MB:.0f} MiB): {r.status_code} in "
            f"{watch.cost.seconds:.2f} s, proxy peak +{watch.cost.peak_growth_mb:.0f} MiB; "
            f"/healthz at most {max(slowest):.3f} s"
        )
        assert r.status_code in (400, 415), r.text  # refused, by its shape or its bytes
        # orjson holds the GIL while it reads a body (~0.2 s and ~13x its size for 17 MiB of
        # numbers; 0.57-1.12 s on CI's two cores, shared with another test's mesh): bounded
        # by the body limit. On the loop, each body held it 2-3 s on a quiet machine.
        assert max(slowest) < 2.0 and watch.cost.peak_growth_mb < 320
    assert digits_ok(mesh.url) == [200] * 4
