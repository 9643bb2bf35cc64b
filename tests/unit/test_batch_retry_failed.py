"""`mesh batch --retry-failed`: the rows an earlier run gave up on (a 429, 5xx or no answer
through all its tries) are taken out of the output and their inputs sent again; answers and
an input's own faults stay, and every key is still in the output once."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
from pathlib import Path

import pytest
from aiohttp import web

from batch import calls
from batch.sinks import Row
from batch.sources import Files
from tests.disks import fill, small_disk
from tests.unit.test_batch_files import digits_mesh


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_rows_given_up_on_are_taken_out_and_the_rest_kept_in_order(
    tmp_path: Path, suffix: str
) -> None:
    """--retry-failed: a row failed after all its tries (its error counts them) leaves the
    file; an answer, and an input's own fault, stay where they were."""
    from batch.sinks import open_sink

    path = tmp_path / f"out{suffix}"
    sink = open_sink(str(path))
    sink.write(Row("a.png", "ok", 1.5, result={"label": 3}))
    sink.write(Row("b.png", "failed", 2.0, error={"status": 415, "error": "not an image"}))
    sink.write(Row("c.png", "failed", None, error={"status": 503, "error": "busy", "attempts": 5}))
    sink.write(Row("d.png", "failed", None, error={"status": None, "error": "too large"}))
    sink.write(Row("e.png", "failed", None, error={"status": None, "error": "gone", "attempts": 5}))
    sink.close()
    sink = open_sink(str(path))
    assert sink.forget_given_up() == 2
    assert sink.answered() == {"a.png", "b.png", "d.png"}
    sink.write(Row("c.png", "ok", 1.0, result={"label": 7}))
    assert sink.forget_given_up() == 0
    sink.close()
    text = path.read_text()
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines()]
    else:
        rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["key"] for r in rows] == ["a.png", "b.png", "d.png", "c.png"]
    assert not list(tmp_path.glob("*.retrying"))


def test_a_rewrite_the_disk_has_no_room_for_leaves_the_output_as_it_was(tmp_path: Path) -> None:
    """The output's disk full when the rows are taken out: SinkError naming the file, the
    output untouched (its rows and its keys), no half-written copy beside it."""
    from batch.sinks import SinkError, open_sink

    with small_disk(tmp_path / "disk", "64k") as disk:
        path = disk / "out.jsonl"
        sink = open_sink(str(path))
        for i in range(40):
            error = {"status": 503, "error": "busy " + "x" * 500, "attempts": 5}
            sink.write(Row(f"{i}.png", "failed" if i % 2 else "ok", None, error=error))
        sink.close()
        before = path.read_bytes()
        fill(disk / "filler")
        sink = open_sink(str(path))
        with pytest.raises(SinkError, match="No space left on device") as refused:
            sink.forget_given_up()
        assert str(path) in str(refused.value)
        with contextlib.suppress(SinkError):
            sink.close()
        assert path.read_bytes() == before
        assert not list(disk.glob("*.retrying"))


def test_a_tables_rows_given_up_on_are_deleted(tmp_path: Path) -> None:
    """The same for a database sink (SQLite here; PostgreSQL in tests/e2e/test_batch.py)."""
    from batch.sql import TableSink

    url = f"sqlite:///{tmp_path / 'out.db'}"
    sink = TableSink(url, "answers")
    sink.write(Row("a.png", "ok", 1.5, result={"label": 3}))
    sink.write(Row("b.png", "failed", 2.0, error={"status": 415, "error": "not an image"}))
    sink.write(Row("c.png", "failed", None, error={"status": 503, "error": "busy", "attempts": 5}))
    sink.close()
    sink = TableSink(url, "answers")
    assert sink.forget_given_up() == 1
    assert sink.answered() == {"a.png", "b.png"}
    sink.close()


async def test_a_rerun_with_retry_failed_answers_what_the_first_gave_up_on(tmp_path: Path) -> None:
    """The mesh refuses everything (503) through a first run's tries: its rows fail. A plain
    rerun sends nothing; one with retry_failed sends those inputs again, and once answered
    each key is in the output once."""
    from batch.runner import Options, run
    from batch.sinks import open_sink

    (tmp_path / "in").mkdir()
    for i in range(6):
        (tmp_path / "in" / f"{i}.png").write_bytes(b"img")
    (tmp_path / "in" / "bad.png").write_bytes(b"bad")
    up = asyncio.Event()
    sent: list[bytes] = []

    async def pipelines(request: web.Request) -> web.Response:
        return web.json_response({"digits": {}})

    async def infer(request: web.Request) -> web.Response:
        body = await request.read()
        sent.append(body)
        if body == b"bad":
            return web.json_response({"error": "not an image"}, status=415)
        if not up.is_set():
            return web.json_response({"error": "busy"}, status=503, headers={"Retry-After": "0"})
        return web.json_response({"result": {"label": 1}})

    out = tmp_path / "out.jsonl"
    retry = calls.Retry(attempts=2, first_s=0.01)
    async with digits_mesh(pipelines, infer) as url:
        options = Options(url, "digits", retry=retry, progress_every_s=60)
        first = await run(Files(str(tmp_path / "in")), open_sink(str(out)), options)
        assert first.counts["failed"] == 7
        up.set()
        sent.clear()
        plain = await run(Files(str(tmp_path / "in")), open_sink(str(out)), options)
        assert plain.counts["skipped"] == 7 and sent == []
        again = Options(url, "digits", retry=retry, progress_every_s=60, retry_failed=True)
        retried = await run(Files(str(tmp_path / "in")), open_sink(str(out)), again)
    assert retried.counts["retried"] == 6 and retried.counts["ok"] == 6
    assert sent == [b"img"] * 6  # the 415 is the input's own: not sent again
    rows = {json.loads(line)["key"]: json.loads(line) for line in out.read_text().splitlines()}
    assert len(out.read_text().splitlines()) == 7 == len(rows)
    assert rows["bad.png"]["error"]["status"] == 415
    assert all(rows[f"{i}.png"]["status"] == "ok" for i in range(6))
