"""`mesh batch` against the running mesh, as a user runs it: a folder of 2,000 generated digit
photos, the batch SIGKILLed half-way and rerun (every input answered exactly once, each answer
the one /infer gives); a manifest with bad inputs recorded while the batch goes on; OCR."""

from __future__ import annotations

import asyncio
import csv
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from samples import digits as digit_samples
from samples.text import suite as text_suite
from tests.conftest import Mesh, postgres_or_skip
from tests.e2e.test_digits import held_out
from tests.procs import ROOT

pytestmark = pytest.mark.slow


def batch(*args: str) -> list[str]:
    return [sys.executable, "-m", "batch", *args]


def write_digits(folder: Path, count: int) -> dict[str, bytes]:
    return digit_samples.write_folder(folder, held_out()[0], count)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def infer_all(url: str, pipeline: str, blobs: dict[str, bytes]) -> dict[str, dict]:
    """/infer's answer for each blob (aiohttp, c=32: the reference is asked as fast as the
    batch asks)."""
    limit = asyncio.Semaphore(32)
    async with aiohttp.ClientSession(url) as session:

        async def one(key: str, blob: bytes) -> tuple[str, dict]:
            async with limit, session.post(f"/v1/pipelines/{pipeline}/infer", data=blob) as r:
                assert r.status == 200, (key, await r.text())
                return key, (await r.json())["result"]

        return dict(await asyncio.gather(*(one(k, b) for k, b in blobs.items())))


@dataclass
class Photos:
    folder: Path
    images: dict[str, bytes]
    expected: dict[str, dict]
    """/infer's answer for each."""


@pytest.fixture(scope="module")
def photos(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Photos:
    folder = tmp_path_factory.mktemp("photos")
    images = write_digits(folder, 2000)
    return Photos(folder, images, asyncio.run(infer_all(mesh.url, "digits", images)))


def kill_half_way(argv: list[str], written: Callable[[], int], log: Path) -> None:
    """Start the batch, SIGKILL it once half of the 2,000 answers are written."""
    with log.open("w") as err:
        first = subprocess.Popen(argv, cwd=ROOT, stderr=err)
    deadline = time.monotonic() + 120
    while written() < 1000:
        assert first.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the batch never got half-way"
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert 1000 <= written() < 2000, "killed half-way"


def assert_answers_equal_infer(answers: list[dict], photos: Photos) -> None:
    assert sorted(row["key"] for row in answers) == sorted(photos.images), "each once"
    assert {row["status"] for row in answers} == {"ok"}
    for row in answers:
        got, want = row["result"]["result"], photos.expected[row["key"]]
        assert got["label"] == want["label"], row["key"]
        np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-6)


def test_a_killed_batch_resumes_and_answers_every_input_once(
    mesh: Mesh, photos: Photos, tmp_path: Path
) -> None:
    out = tmp_path / "answers.jsonl"
    argv = batch("digits", str(photos.folder), "-o", str(out), "--url", mesh.url, "-c", "16")

    def written() -> int:
        return out.read_text().count("\n") if out.exists() else 0

    kill_half_way(argv, written, tmp_path / "first.log")
    second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "answered before" in second.stderr
    assert_answers_equal_infer(rows(out), photos)

    # A third run has nothing left to send.
    third = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and len(rows(out)) == 2000
    assert "0 ok, 0 failed, 2000 answered before" in third.stderr


def test_bad_inputs_are_recorded_and_the_batch_goes_on(mesh: Mesh, tmp_path: Path) -> None:
    good = write_digits(tmp_path / "good", 6)
    (tmp_path / "corrupt.png").write_bytes(next(iter(good.values()))[:60])
    (tmp_path / "notes.png").write_bytes(b"this is a text file, not an image\n" * 4)
    (tmp_path / "blank.png").write_bytes(digit_samples.blank_images(1, seed=3)[0])
    manifest = tmp_path / "inputs.csv"
    with manifest.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "customer"])
        for i, key in enumerate(good):
            writer.writerow([f"good/{key}", f"c{i}"])
        for name in ("corrupt.png", "missing.png", "notes.png", "blank.png"):
            writer.writerow([name, "bad"])
    out = tmp_path / "answers.csv"
    argv = batch("digits", str(manifest), "-o", str(out), "--url", mesh.url)
    done = subprocess.run([*argv, "--max-failed", "0.5"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with out.open(newline="") as f:
        written = {row["key"]: row for row in csv.DictReader(f)}
    assert len(written) == 10
    for i, key in enumerate(good):
        row = written[f"good/{key}"]
        assert row["status"] == "ok" and row["customer"] == f"c{i}", row
        assert isinstance(json.loads(row["result"])["result"]["label"], int)
    errors = {name: json.loads(written[name]["error"]) for name in
              ("corrupt.png", "missing.png", "notes.png", "blank.png")}  # fmt: skip
    assert all(written[name]["status"] == "failed" for name in errors)
    assert errors["missing.png"] == {"status": None, "error": "no such file: missing.png"}
    assert errors["corrupt.png"]["status"] == 400
    assert "not a decodable image" in errors["corrupt.png"]["error"]
    assert errors["notes.png"]["status"] == 415  # not an image at all
    assert errors["blank.png"]["status"] == 400 and "has no ink" in errors["blank.png"]["error"]
    # Into a fresh output (all ten sent again), 4 of 10 failing is over a tenth: exit 1.
    out.unlink()
    strict = subprocess.run(
        [*argv, "--max-failed", "0.1"], cwd=ROOT, capture_output=True, text=True
    )
    assert strict.returncode == 1 and "4 of 10 failed" in strict.stderr


def test_ocr_pages_from_a_jsonl_manifest_read_as_infer_reads_them(
    mesh: Mesh, tmp_path: Path
) -> None:
    pages = text_suite(2, seed=9, categories=["line_small", "line_medium"])
    blobs: dict[str, bytes] = {}
    with (tmp_path / "pages.jsonl").open("w") as manifest:
        for i, page in enumerate(pages):
            (tmp_path / f"page{i}.png").write_bytes(page.image)
            blobs[f"page{i}.png"] = page.image
            manifest.write(json.dumps({"path": f"page{i}.png", "batch": 7}) + "\n")
    out = tmp_path / "text.jsonl"
    argv = batch("ocr", str(tmp_path / "pages.jsonl"), "-o", str(out), "--url", mesh.url)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = asyncio.run(infer_all(mesh.url, "ocr", blobs))
    answers = rows(out)
    assert len(answers) == len(pages)
    for row in answers:
        assert row["batch"] == "7"
        lines = [line["text"] for line in row["result"]["result"]["lines"]]
        assert lines == [line["text"] for line in expected[row["key"]]["lines"]]


def test_an_unknown_pipeline_or_source_stops_before_sending(mesh: Mesh, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    wrong = subprocess.run(
        batch("digitz", str(tmp_path), "-o", str(out), "--url", mesh.url),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 2 and "no pipeline 'digitz'" in wrong.stderr
    missing = subprocess.run(
        batch("digits", str(tmp_path / "nowhere"), "-o", str(out), "--url", mesh.url),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "not a folder" in missing.stderr


def test_a_postgresql_table_in_and_out_killed_and_resumed(
    mesh: Mesh, photos: Photos, tmp_path: Path
) -> None:
    """The reference design's batch: rows of a table not answered yet, through the mesh, the
    answers into another table; killed half-way and rerun."""
    import sqlalchemy as sa

    server = postgres_or_skip()
    engine = sa.create_engine(server.url)
    try:
        scans = sa.Table(
            "scans",
            sa.MetaData(),
            sa.Column("id", sa.Text, primary_key=True),
            sa.Column("image", sa.LargeBinary),
        )
        scans.create(engine)
        with engine.begin() as conn:
            conn.execute(scans.insert(), [{"id": k, "image": b} for k, b in photos.images.items()])
            conn.execute(scans.insert(), [{"id": "zz-not-an-image", "image": b"hello"}])
            conn.execute(scans.insert(), [{"id": "zz-null", "image": None}])
        argv = batch(
            "digits", server.url, "--table", "scans", "--key", "id", "--image", "image",
            "-o", server.url, "--output-table", "answers", "--url", mesh.url, "-c", "16",
        )  # fmt: skip

        def written() -> int:
            with engine.connect() as conn:
                try:
                    return conn.execute(sa.text("SELECT count(*) FROM answers")).scalar_one()
                except sa.exc.ProgrammingError:  # not made yet
                    return 0

        kill_half_way(argv, written, tmp_path / "first.log")
        second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        # The rerun read only the rows the output table lacked (an anti-join in the database).
        assert ", 0 answered before;" in second.stderr, second.stderr
        with engine.connect() as conn:
            answers = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM answers"))]
        bad = {row["key"]: row for row in answers if row["key"].startswith("zz-")}
        assert bad["zz-not-an-image"]["status"] == "failed"
        assert bad["zz-not-an-image"]["error"]["status"] == 415
        assert bad["zz-null"]["error"] == {
            "status": None,
            "error": "the image column holds NoneType, not bytes or a path",
        }
        assert_answers_equal_infer([r for r in answers if r["key"] not in bad], photos)
    finally:
        engine.dispose()
        server.stop()


def test_an_sqlite_query_naming_files(mesh: Mesh, tmp_path: Path) -> None:
    import sqlalchemy as sa

    good = write_digits(tmp_path, 3)
    url = f"sqlite:///{tmp_path / 'scans.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE scans (n INTEGER PRIMARY KEY, file TEXT, kept INT)"))
        for i, key in enumerate(good):
            conn.execute(
                sa.text("INSERT INTO scans VALUES (:n, :f, 1)"), {"n": i, "f": str(tmp_path / key)}
            )
        conn.execute(
            sa.text("INSERT INTO scans VALUES (7, :f, 1)"), {"f": str(tmp_path / "gone.png")}
        )
        conn.execute(sa.text("INSERT INTO scans VALUES (8, :f, 0)"), {"f": str(tmp_path / key)})
    engine.dispose()
    out = tmp_path / "out.jsonl"
    query = "SELECT n, file FROM scans WHERE kept = 1"
    done = subprocess.run(
        batch("digits", url, "--query", query, "--key", "n", "--image", "file", "-o", str(out),
              "--url", mesh.url),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = {row["key"]: row for row in rows(out)}
    assert set(answers) == {"0", "1", "2", "7"}  # row 8 is not selected
    assert all(answers[k]["status"] == "ok" for k in ("0", "1", "2"))
    assert answers["7"]["error"]["error"].startswith("no such file: ")
