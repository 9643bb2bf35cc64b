"""`mesh batch` against the running mesh, as a user runs it: 2,000 generated scans (1,920 digit
photos and 80 text images: lines of every size, and short notes noisy, compressed, coloured
or light on dark) in a folder and in a PostgreSQL table, each kind through its pipeline, each
batch SIGKILLed half-way and rerun (every input answered exactly once, each answer the one
/infer gives); a manifest with bad inputs recorded while the batch goes on; a query."""

from __future__ import annotations

import asyncio
import csv
import functools
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

from protos.ports import free_port
from samples import digits as digit_samples
from samples import text as text_samples
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


LONGEST_BUDGET = {"X-Request-Timeout-Ms": "60000"}
"""The proxy's longest: 32 OCR pages at once on a slow hour, beside the other worker, once
outlived `ocr`'s own 15 s (a 504 in this reference, not in the batch, which retries it)."""


async def infer_all(url: str, pipeline: str, blobs: dict[str, bytes]) -> dict[str, dict]:
    """/infer's answer for each blob (aiohttp, c=32: the reference is asked as fast as the
    batch asks)."""
    limit = asyncio.Semaphore(32)
    async with aiohttp.ClientSession(url, headers=LONGEST_BUDGET) as session:

        async def one(key: str, blob: bytes) -> tuple[str, dict]:
            async with limit, session.post(f"/v1/pipelines/{pipeline}/infer", data=blob) as r:
                assert r.status == 200, (key, await r.text())
                return key, (await r.json())["result"]

        return dict(await asyncio.gather(*(one(k, b) for k, b in blobs.items())))


TEXT = {"line_small": 20, "line_medium": 20, "line_large": 20,
        "noisy": 5, "jpeg": 5, "coloured": 5, "light_on_dark": 5}  # fmt: skip
"""80 text images: OCR costs ~60 ms a line on two cores, ~150 ms a short note, and each is
read three times here (for /infer's answers, from the folder, from the table); 160 took ~25 s
more of the suite for no other case."""
DIGITS = 2000 - sum(TEXT.values())
FOLDERS = {"digits": "digits", "ocr": "text"}


@dataclass
class Scans:
    folder: Path
    """digits/<look>/*.png|jpg and text/<category>/*.png|jpg"""
    images: dict[str, dict[str, bytes]]
    """{pipeline: {key relative to its folder: image}}"""
    expected: dict[str, dict[str, dict]]
    """{pipeline: {key: /infer's result}}"""


@pytest.fixture(scope="module")
def scans(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Scans:
    folder = tmp_path_factory.mktemp("scans")
    images = {
        "digits": write_digits(folder / "digits", DIGITS),
        "ocr": {k: v[0] for k, v in text_samples.write_folder(folder / "text", TEXT).items()},
    }
    expected = {p: asyncio.run(infer_all(mesh.url, p, blobs)) for p, blobs in images.items()}
    return Scans(folder, images, expected)


def kill_half_way(argv: list[str], written: Callable[[], int], total: int, log: Path) -> None:
    """Start the batch, SIGKILL it once half of its `total` answers are written."""
    with log.open("w") as err:
        first = subprocess.Popen(argv, cwd=ROOT, stderr=err)
    deadline = time.monotonic() + 120
    while written() < total // 2:
        assert first.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the batch never got half-way"
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert total // 2 <= written() < total, "killed half-way"


def assert_answers_equal_infer(answers: list[dict], expected: dict[str, dict]) -> None:
    assert sorted(row["key"] for row in answers) == sorted(expected), "each once"
    assert {row["status"] for row in answers} == {"ok"}
    for row in answers:
        got, want = row["result"]["result"], expected[row["key"]]
        if "lines" in want:  # OCR
            assert [x["text"] for x in got["lines"]] == [x["text"] for x in want["lines"]]
            for mine, theirs in zip(got["lines"], want["lines"], strict=True):
                np.testing.assert_allclose(mine["box"], theirs["box"], atol=1.0)
            continue
        assert got["label"] == want["label"], row["key"]
        np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-6)


def concurrency(pipeline: str) -> str:
    return "16" if pipeline == "digits" else "8"


@pytest.mark.parametrize("pipeline", ["digits", "ocr"])
def test_a_killed_batch_resumes_and_answers_every_input_once(
    mesh: Mesh, scans: Scans, pipeline: str, tmp_path: Path
) -> None:
    out = tmp_path / "answers.jsonl"
    total = len(scans.images[pipeline])
    argv = batch(pipeline, str(scans.folder / FOLDERS[pipeline]), "-o", str(out),
                 "--url", mesh.url, "-c", concurrency(pipeline))  # fmt: skip

    def written() -> int:
        return out.read_text().count("\n") if out.exists() else 0

    kill_half_way(argv, written, total, tmp_path / "first.log")
    second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "answered before" in second.stderr
    assert_answers_equal_infer(rows(out), scans.expected[pipeline])

    # A third run has nothing left to send.
    third = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and len(rows(out)) == total
    assert f"0 ok, 0 failed, {total} answered before" in third.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_a_stopping_pod_keeps_every_answer(
    mesh: Mesh, scans: Scans, sig: signal.Signals, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT) or a pod stopping (SIGTERM): exit 130 at once, every answered row
    written whole; the rerun sends only the rest."""
    out = tmp_path / "answers.jsonl"
    argv = batch("digits", str(scans.folder / "digits"), "-o", str(out), "--url", mesh.url)
    first = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not out.exists() or out.read_text().count("\n") < 200:
        assert first.poll() is None and time.monotonic() < deadline, "no answers"
        time.sleep(0.02)
    first.send_signal(sig)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    assert "rerun the same command to resume" in err
    kept = out.read_text()
    assert kept.endswith("\n") and 200 <= len(rows(out)) < DIGITS  # no torn row
    second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert f"{len(kept.splitlines())} answered before" in second.stderr
    assert_answers_equal_infer(rows(out), scans.expected["digits"])


def doors(mesh: Mesh, door: str) -> list[str]:
    return ["--door", "grpc", "--grpc", mesh.grpc_address] if door == "grpc" else []


@pytest.mark.parametrize("door", ["rest", "grpc"])
def test_bad_inputs_are_recorded_and_the_batch_goes_on(
    mesh: Mesh, door: str, tmp_path: Path
) -> None:
    """The same rows through either door: the mesh's error and the REST door's status for it
    (over gRPC, the status the door names beside its code)."""
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
    argv = batch("digits", str(manifest), "-o", str(out), "--url", mesh.url, *doors(mesh, door))
    done = subprocess.run([*argv, "--max-failed", "0.5"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with out.open(newline="") as f:
        written = {row["key"]: row for row in csv.DictReader(f)}
    assert len(written) == 10
    for i, key in enumerate(good):
        row = written[f"good/{key}"]
        assert row["status"] == "ok" and row["customer"] == f"c{i}", row
        assert isinstance(json.loads(row["result"])["result"]["label"], int)
        # The mesh's logs name the request by its file (a path with a folder in it); a
        # stream's ids are told apart by a counter after it (".7").
        answer_id = json.loads(row["result"])["id"]
        if door == "grpc":
            answer_id, _, counter = answer_id.rpartition(".")
            assert counter.isdigit()
        assert answer_id == f"batch-good/{key}"
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


def test_the_grpc_doors_streams_answer_as_rest_does(
    mesh: Mesh, scans: Scans, tmp_path: Path
) -> None:
    """`--door grpc`: each row holds /infer's result, `partial` and `steps`, as over REST."""
    for pipeline, part in (("digits", "digits/noisy"), ("ocr", "text/line_small")):
        out = tmp_path / f"{pipeline}.jsonl"
        argv = batch(pipeline, str(scans.folder / part), "-o", str(out), "--url", mesh.url,
                     "-c", concurrency(pipeline), *doors(mesh, "grpc"))  # fmt: skip
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        prefix = part.removeprefix(f"{FOLDERS[pipeline]}/")
        expected = {
            k.removeprefix(f"{prefix}/"): v
            for k, v in scans.expected[pipeline].items()
            if k.startswith(f"{prefix}/")
        }
        answers = rows(out)
        assert len(answers) == len(expected) >= 20
        assert_answers_equal_infer(answers, expected)
        for row in answers:
            assert row["result"]["partial"] is False
            assert row["result"]["steps"] and {s["status"] for s in row["result"]["steps"]} == {
                "ok"
            }


def test_an_unknown_pipeline_or_source_stops_before_sending(mesh: Mesh, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    wrong = subprocess.run(
        batch("digitz", str(tmp_path), "-o", str(out), "--url", mesh.url),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 2 and "no pipeline 'digitz'" in wrong.stderr
    over_grpc = subprocess.run(
        batch("digitz", str(tmp_path), "-o", str(out), "--url", mesh.url, *doors(mesh, "grpc")),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert over_grpc.returncode == 2 and "no pipeline 'digitz'" in over_grpc.stderr
    missing = subprocess.run(
        batch("digits", str(tmp_path / "nowhere"), "-o", str(out), "--url", mesh.url),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "not a folder" in missing.stderr
    port = free_port()
    nobody = subprocess.run(
        batch("digits", str(tmp_path), "-o", str(out), "--url", f"http://127.0.0.1:{port}"),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert nobody.returncode == 2
    assert f"cannot be reached: cannot connect to 127.0.0.1:{port}" in nobody.stderr


def test_a_postgresql_table_in_and_out_killed_and_resumed(
    mesh: Mesh, scans: Scans, tmp_path: Path
) -> None:
    """The reference design's batch: rows of a table not answered yet, through the mesh, the
    answers into another table; killed half-way and rerun. One table of mixed scans, each kind
    sent to its pipeline by a query, both answering into one table."""
    import sqlalchemy as sa

    server = postgres_or_skip()
    engine = sa.create_engine(server.url)
    try:
        table = sa.Table(
            "scans",
            sa.MetaData(),
            sa.Column("id", sa.Text, primary_key=True),
            sa.Column("kind", sa.Text),
            sa.Column("image", sa.LargeBinary),
        )
        table.create(engine)
        kinds = {"digits": "digit", "ocr": "text"}
        with engine.begin() as conn:
            for pipeline, blobs in scans.images.items():
                conn.execute(table.insert(), [
                    {"id": f"{FOLDERS[pipeline]}/{k}", "kind": kinds[pipeline], "image": b}
                    for k, b in blobs.items()
                ])  # fmt: skip
            conn.execute(table.insert(), [{"id": "zz-not-an-image", "kind": "digit",
                                           "image": b"hello"}])  # fmt: skip
            conn.execute(table.insert(), [{"id": "zz-null", "kind": "digit", "image": None}])

        def written(kind: str) -> int:
            with engine.connect() as conn:
                try:
                    return conn.execute(
                        sa.text("SELECT count(*) FROM answers JOIN scans ON key = id "
                                "WHERE kind = :kind"), {"kind": kind}
                    ).scalar_one()  # fmt: skip
                except sa.exc.ProgrammingError:  # not made yet
                    return 0

        for pipeline, kind in kinds.items():
            query = f"SELECT id, image FROM scans WHERE kind = '{kind}'"
            argv = batch(
                pipeline, server.url, "--query", query, "-o", server.url,
                "--output-table", "answers", "--url", mesh.url, "-c", concurrency(pipeline),
            )  # fmt: skip
            total = len(scans.images[pipeline]) + (2 if kind == "digit" else 0)
            kill_half_way(
                argv, functools.partial(written, kind), total, tmp_path / f"{pipeline}.log"
            )
            second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert second.returncode == 0, second.stderr
            # The rerun read only the rows the output table lacked (an anti-join in the database).
            assert ", 0 answered before;" in second.stderr, second.stderr
        with engine.connect() as conn:
            answers = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM answers"))]
        assert len(answers) == 2002
        bad = {row["key"]: row for row in answers if row["key"].startswith("zz-")}
        assert bad["zz-not-an-image"]["status"] == "failed"
        assert bad["zz-not-an-image"]["error"]["status"] == 415
        assert bad["zz-null"]["error"] == {
            "status": None,
            "error": "the image column holds NoneType, not bytes or a path",
        }
        for pipeline, folder in FOLDERS.items():
            mine = [
                {**r, "key": r["key"].removeprefix(f"{folder}/")}
                for r in answers
                if r["key"].startswith(f"{folder}/")
            ]
            assert_answers_equal_infer(mine, scans.expected[pipeline])
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


def test_a_postgresql_restart_mid_run_is_resumed_not_fatal(mesh: Mesh, scans: Scans) -> None:
    """PostgreSQL (source and output) restarted half-way, down 2 s: the run waits, opens both
    again and goes on as a rerun would (the output's rows skipped), and ends with every scan
    answered once, as /infer answers it. Before, the run died with a traceback."""
    import sqlalchemy as sa

    server = postgres_or_skip()
    engine = sa.create_engine(server.url)
    blobs = dict(list(scans.images["digits"].items())[:600])
    try:
        table = sa.Table(
            "scans", sa.MetaData(),
            sa.Column("id", sa.Text, primary_key=True), sa.Column("image", sa.LargeBinary),
        )  # fmt: skip
        table.create(engine)
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": k, "image": b} for k, b in blobs.items()])

        def written() -> int:
            try:
                with engine.connect() as conn:
                    return conn.execute(sa.text("SELECT count(*) FROM answers")).scalar_one()
            except sa.exc.SQLAlchemyError:  # not made yet, or the server restarting
                return 0

        argv = batch(
            "digits", server.url, "--table", "scans", "--key", "id", "-o", server.url,
            "--output-table", "answers", "--url", mesh.url, "-c", "8", "--rate", "300",
        )  # fmt: skip
        run = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while written() < 200:
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            assert time.monotonic() < deadline, "the batch never got going"
            time.sleep(0.05)
        engine.dispose()
        server.restart(down_s=2.0)
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        assert "resuming in" in err, err
        with engine.connect() as conn:
            answers = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM answers"))]
        assert_answers_equal_infer(answers, {k: scans.expected["digits"][k] for k in blobs})
    finally:
        engine.dispose()
        server.stop()
