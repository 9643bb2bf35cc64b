"""The batch's files and its client's retry policy: a row torn by a kill is cut off, keys
already answered are found again, manifests stream with their columns, and a transient
refusal is retried while the input's own fault never is."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from batch import calls, http1, sources
from batch.sinks import CsvSink, JsonlSink, Row
from batch.sources import Files, Input, Manifest, SourceError, open_source
from batch.window import Window
from tests.disks import grow, small_disk


def test_a_torn_jsonl_row_is_cut_and_answered_keys_are_found(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = JsonlSink(path)
    sink.write(Row("a.png", "ok", 1.5, result={"label": 3}))
    sink.write(Row("b.png", "failed", None, error={"status": 422, "error": "no ink"}))
    sink.close()
    with path.open("a") as f:
        f.write('{"key": "c.png", "status": "o')  # killed mid-write
    again = JsonlSink(path)
    assert again.answered() == {"a.png", "b.png"}
    again.write(Row("c.png", "ok", 2.0, result={"label": 1}))
    again.close()
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]
    assert keys == ["a.png", "b.png", "c.png"]


def test_csv_rows_carry_json_and_the_manifest_columns_once_headed(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    sink = CsvSink(path, ("customer", "status"))
    sink.write(
        Row("a.png", "ok", 1.0, result={"t": "x,y"}, extra={"customer": "7", "status": "new"})
    )
    sink.close()
    sink = CsvSink(path, ("customer", "status"))
    assert sink.answered() == {"a.png"}
    sink.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "key,status,latency_ms,result,error,customer,input.status"
    assert len(lines) == 2 and '"{""t"":""x,y""}"' in lines[1] and lines[1].endswith(",7,new")


def test_sources_stream_folders_globs_and_manifests(tmp_path: Path) -> None:
    for name in ("b/2.png", "a/1.png", "a/0.jpg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert [i.key for i in Files(str(tmp_path))] == ["a/0.jpg", "a/1.png", "b/2.png"]
    assert sorted(i.key for i in Files(f"{tmp_path}/*/*.png")) == ["a/1.png", "b/2.png"]
    assert [i.key for i in Files(f"{tmp_path}/")] == ["a/0.jpg", "a/1.png", "b/2.png"]
    assert Files(str(tmp_path)).count() == 3
    # The batch's own output, written beside the images, is not one of them (by any name
    # that reaches it); a file of the same name elsewhere is.
    (tmp_path / "a" / "out.jsonl").write_text("{}\n")
    (tmp_path / "b" / "out.jsonl").write_text("{}\n")
    for output in (f"{tmp_path}/a/out.jsonl", f"{tmp_path}/b/../a/out.jsonl"):
        keys = [i.key for i in open_source(str(tmp_path), output=output)]
        assert keys == ["a/0.jpg", "a/1.png", "b/2.png", "b/out.jsonl"]
        assert "a/out.jsonl" not in [i.key for i in Files(f"{tmp_path}/*/*", output)]
    (tmp_path / "a" / "out.jsonl").unlink()
    (tmp_path / "b" / "out.jsonl").unlink()
    with contextlib.chdir(tmp_path):  # a relative glob: keys relative to the current folder
        assert sorted(i.key for i in Files("*/*.png")) == ["a/1.png", "b/2.png"]
        assert sorted(i.key for i in Files("a/*")) == ["0.jpg", "1.png"]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        '{"path": "a/1.png", "n": 1}\nnot json\n{"file": "x"}\n{"path": "no.png"}\n{"path": 5}\n'
    )
    items = list(Manifest(manifest))
    assert items[0] == Input("a/1.png", tmp_path / "a/1.png", {"n": "1"})
    assert [i.problem for i in items[1:]] == [
        "line 2 is not JSON (Expecting value)",
        "line 3 has no 'path'",
        "no such file: no.png",
        "line 5 has a non-text 'path'",
    ]
    with pytest.raises(SourceError, match="no column 'path'"):
        (tmp_path / "m.csv").write_text("file,n\na/1.png,1\n")
        Manifest(tmp_path / "m.csv")


def test_a_csv_field_over_the_limit_fails_its_row_only(tmp_path: Path, monkeypatch) -> None:
    """Long text passes through (Python's csv stops at 128 KiB unless told); a field past
    the batch's own limit is that row's failure, and the rows after it are read."""
    import csv

    (tmp_path / "a.png").write_bytes(b"x")
    monkeypatch.setattr(sources, "CSV_FIELD", 300_000)
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"path,note\na.png,{'n' * 200_000}\na.png,{'n' * 400_000}\na.png,short\n")
    before = csv.field_size_limit(131_072)  # Python's default, whatever ran before
    try:
        items = list(Manifest(manifest))
    finally:
        csv.field_size_limit(before)
    assert [len(i.extra.get("note", "")) for i in items] == [200_000, 0, 5]
    assert [i.problem for i in items] == [
        None,
        "row 3 cannot be read: field larger than field limit (300000)",
        None,
    ]


Handler = Callable[[web.Request], Awaitable[web.Response]]


@contextlib.asynccontextmanager
async def digits_mesh(pipelines: Handler | None, infer: Handler) -> AsyncIterator[str]:
    """A real HTTP server on 127.0.0.1 standing in for the mesh's routes the batch calls;
    its URL."""
    app = web.Application()
    if pipelines is not None:
        app.router.add_get("/v1/pipelines", pipelines)
    app.router.add_post("/v1/pipelines/digits/infer", infer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/"))
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def _mesh(answers: list[tuple[int, dict, dict]], seen: list[bytes]) -> AsyncIterator[str]:
    """The mesh's /infer answering each POST with the next of `answers` (status, JSON body,
    headers), the last one again once they run out."""

    async def handle(request: web.Request) -> web.Response:
        seen.append(await request.read())
        status, body, headers = answers[min(len(seen), len(answers)) - 1]
        return web.json_response(body, status=status, headers=headers)

    async with digits_mesh(None, handle) as url:
        yield url


async def _infer(url: str, item: Input, retry: calls.Retry) -> Row:
    door = calls.RestDoor(http1.Client(url, timeout_s=10), "digits")
    try:
        return await calls.infer(door.send, item, retry, 2**20)
    finally:
        await door.close()


async def test_transient_refusals_are_retried_and_a_bad_input_never(tmp_path: Path) -> None:
    image = tmp_path / "a.png"
    image.write_bytes(b"img")
    item = Input("a.png", image)
    retry = calls.Retry(attempts=3, first_s=0.01)
    busy = (503, {"error": "pipeline at capacity"}, {"Retry-After": "0"})
    seen: list[bytes] = []
    async with _mesh([busy, (200, {"result": {"label": 4}}, {})], seen) as url:
        row = await _infer(url, item, retry)
    assert row.status == "ok" and row.result == {"result": {"label": 4}}
    assert seen == [b"img", b"img"]

    seen = []
    async with _mesh([(422, {"error": "no ink in the image"}, {})], seen) as url:
        row = await _infer(url, item, retry)
    assert row.status == "failed" and len(seen) == 1
    assert row.error == {"status": 422, "error": "no ink in the image"}

    seen = []
    async with _mesh([(429, {"error": "slow down"}, {})], seen) as url:
        row = await _infer(url, item, retry)
    assert row.status == "failed" and len(seen) == 3
    assert row.error == {"status": 429, "error": "slow down", "attempts": 3}


async def test_what_is_not_a_file_or_too_large_fails_its_row_without_being_read(
    tmp_path: Path,
) -> None:
    """A FIFO in the folder used to block the batch's open for good (Ctrl-C and SIGTERM
    included), and a device or a disk image would have been read whole into memory: each is a
    failed row naming why, sent to nobody, and the files beside them are answered."""
    import os

    from batch.runner import Options, run

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"img")
    os.mkfifo(folder / "b.png")
    (folder / "c.png").symlink_to("/dev/zero")
    with (folder / "d.png").open("wb") as f:
        f.truncate(3 * 2**20)  # sparse: 3 MiB that take no disk
    (folder / "e.png").write_bytes(b"img2")
    seen: list[bytes] = []

    async def pipelines(request: web.Request) -> web.Response:
        return web.json_response({"digits": {}})

    async def infer(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"result": {"label": 1}})

    out = tmp_path / "out.jsonl"
    async with digits_mesh(pipelines, infer) as url:
        options = Options(url, "digits", progress_every_s=60, max_file_bytes=2**20)
        await asyncio.wait_for(run(Files(str(folder)), JsonlSink(out), options), 30)
    rows = {row["key"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert sorted(seen) == [b"img", b"img2"]
    assert rows["a.png"]["status"] == rows["e.png"]["status"] == "ok"
    errors = {key: rows[key]["error"]["error"] for key in ("b.png", "c.png", "d.png")}
    assert errors == {
        "b.png": f"{folder / 'b.png'} is not a regular file (a FIFO)",
        "c.png": f"{folder / 'c.png'} is not a regular file (a device)",
        "d.png": f"{folder / 'd.png'} is 3.0 MiB, over the 1 MiB --max-file-mb",
    }


async def test_the_api_key_goes_with_every_request(tmp_path: Path) -> None:
    """MESH_API_KEY (Options.api_key) is sent on the pipeline check and on every input; a
    mesh that refuses the batch stops it before anything is sent."""
    from batch.runner import MeshError, Options, run

    (tmp_path / "in").mkdir()
    for name in ("a.png", "b.png"):
        (tmp_path / "in" / name).write_bytes(b"img")
    asked: list[str | None] = []

    async def pipelines(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.json_response({"error": "missing or wrong API key"}, status=401)
        return web.json_response({"digits": {}})

    async def infer(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Authorization"))
        return web.json_response({"result": {"label": 1}})

    async with digits_mesh(pipelines, infer) as url:
        out = tmp_path / "out.jsonl"
        progress = await run(
            Files(str(tmp_path / "in")),
            JsonlSink(out),
            Options(url, "digits", api_key="s3cret", progress_every_s=60),
        )
        with pytest.raises(MeshError, match="answered 401"):
            await run(Files(str(tmp_path / "in")), JsonlSink(tmp_path / "x.jsonl"),
                      Options(url, "digits"))  # fmt: skip
    assert progress.counts["ok"] == 2
    assert asked == ["Bearer s3cret"] * 3 + [None]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
async def test_a_full_disk_stops_the_run_with_its_reason_and_a_rerun_resumes(
    tmp_path: Path, suffix: str
) -> None:
    """The output's disk fills mid-run: the run stops with SinkError naming the output and
    the reason (the CLI's exit status 1 and one line; it was a traceback, its flush failing
    again on close), and with room again a rerun answers every input exactly once."""
    from batch.runner import Options, run
    from batch.sinks import SinkError, open_sink

    (tmp_path / "in").mkdir()
    for i in range(120):
        (tmp_path / "in" / f"{i:03d}.png").write_bytes(b"img")

    async def pipelines(request: web.Request) -> web.Response:
        return web.json_response({"digits": {}})

    async def infer(request: web.Request) -> web.Response:
        return web.json_response({"result": {"label": 1, "words": ["x" * 100]}})

    async with digits_mesh(pipelines, infer) as url:
        options = Options(url, "digits", progress_every_s=60)
        with small_disk(tmp_path / "disk", "12k") as disk:
            out = disk / f"out{suffix}"
            with pytest.raises(SinkError, match="No space left on device") as stopped:
                await run(Files(str(tmp_path / "in")), open_sink(str(out)), options)
            assert str(out) in str(stopped.value) and "rerun" in str(stopped.value)
            reopened = open_sink(str(out))  # the torn last row cut off
            kept = len(reopened.answered())
            reopened.close()
            assert 0 < kept < 120
            grow(disk, "1m")
            progress = await run(Files(str(tmp_path / "in")), open_sink(str(out)), options)
            assert progress.counts["ok"] == 120 - kept
            text = out.read_text()
    if suffix == ".jsonl":
        keys = [json.loads(line)["key"] for line in text.splitlines()]
    else:
        keys = [row["key"] for row in csv.DictReader(io.StringIO(text))]
    assert sorted(keys) == [f"{i:03d}.png" for i in range(120)]


async def test_a_batch_sends_no_more_at_once_than_the_mesh_takes(tmp_path: Path) -> None:
    """A pipeline that takes two requests at once (OCR takes three 7 Mpx pages) and refuses
    more with 503: sent 16 at a time with three attempts each, most inputs failed (21 of 24
    scanned pages through the shipped `ocr`, five attempts each). The window closes to what
    the mesh takes, and a refusal while the batch's own requests fill it spends no attempt:
    every input is answered."""
    from batch.runner import Options, run

    (tmp_path / "in").mkdir()
    for i in range(40):
        (tmp_path / "in" / f"{i:02d}.png").write_bytes(b"img%d" % i)
    taken, most, refused = 0, 0, 0

    async def pipelines(request: web.Request) -> web.Response:
        return web.json_response({"digits": {}})

    async def infer(request: web.Request) -> web.Response:
        nonlocal taken, most, refused
        await request.read()
        if taken >= 2:
            refused += 1
            return web.json_response(
                {"error": "pipeline 'digits' at capacity (2 requests in flight)"},
                status=503,
                headers={"Retry-After": "1"},
            )
        taken += 1
        most = max(most, taken)
        try:
            await asyncio.sleep(0.2)
        finally:
            taken -= 1
        return web.json_response({"result": {"label": 1}})

    out = tmp_path / "out.jsonl"
    async with digits_mesh(pipelines, infer) as url:
        options = Options(
            url, "digits", concurrency=16, retry=calls.Retry(attempts=3), progress_every_s=60
        )
        ran = run(Files(str(tmp_path / "in")), JsonlSink(out), options)
        progress = await asyncio.wait_for(ran, 60)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok"] * 40, [r["error"] for r in rows if r["error"]]
    assert progress.counts["ok"] == 40 and most == 2 and refused > 0
    assert progress.narrowed is not None and progress.narrowed[0] <= 2
    assert "as few as" in progress.close()


async def test_the_window_closes_to_what_the_mesh_took_and_opens_an_answer_at_a_time() -> None:
    window = Window(8)
    async with contextlib.AsyncExitStack() as held:
        for _ in range(5):
            await held.enter_async_context(window.slot())
        assert window.refused()  # 5 of its own in flight: the batch crowded the mesh
        assert window.limit == 5
    assert not window.refused()  # none in flight: the mesh was full of others
    assert window.limit == 1 and window.narrowest == 1
    for expected in (2.0, 2.5, 2.9):
        window.answered()
        assert window.limit == pytest.approx(expected, abs=0.01)
    for _ in range(100):
        window.answered()
    assert window.limit == 8  # never past --concurrency
