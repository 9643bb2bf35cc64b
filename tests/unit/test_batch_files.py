"""The batch's files and its client's retry policy: a row torn by a kill is cut off, keys
already answered are found again, manifests stream with their columns, and a transient
refusal is retried while the input's own fault never is."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from batch import calls
from batch.sinks import CsvSink, JsonlSink, Row
from batch.sources import Files, Input, Manifest, SourceError


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
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        '{"path": "a/1.png", "n": 1}\nnot json\n{"file": "x"}\n{"path": "no.png"}\n'
    )
    items = list(Manifest(manifest))
    assert items[0] == Input("a/1.png", tmp_path / "a/1.png", {"n": "1"})
    assert [i.problem for i in items[1:]] == [
        "line 2 is not JSON (Expecting value)",
        "line 3 has no 'path'",
        "no such file: no.png",
    ]
    with pytest.raises(SourceError, match="no column 'path'"):
        (tmp_path / "m.csv").write_text("file,n\na/1.png,1\n")
        Manifest(tmp_path / "m.csv")


def _client(answers: list[httpx.Response], seen: list[int]) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        return answers[min(len(seen), len(answers)) - 1]

    return httpx.AsyncClient(transport=httpx.MockTransport(handle), base_url="http://mesh")


async def test_transient_refusals_are_retried_and_a_bad_input_never(tmp_path: Path) -> None:
    image = tmp_path / "a.png"
    image.write_bytes(b"img")
    item = Input("a.png", image)
    retry = calls.Retry(attempts=3, first_s=0.01)
    busy = httpx.Response(503, json={"error": "pipeline at capacity"}, headers={"Retry-After": "0"})
    answer = httpx.Response(200, json={"result": {"label": 4}})
    seen: list[int] = []
    async with _client([busy, answer], seen) as client:
        row = await calls.infer(client, "digits", item, retry)
    assert row.status == "ok" and row.result == {"result": {"label": 4}} and len(seen) == 2

    seen = []
    refused = httpx.Response(422, json={"error": "no ink in the image"})
    async with _client([refused], seen) as client:
        row = await calls.infer(client, "digits", item, retry)
    assert row.status == "failed" and len(seen) == 1
    assert row.error == {"status": 422, "error": "no ink in the image"}

    seen = []
    async with _client([httpx.Response(429, json={"error": "slow down"})], seen) as client:
        row = await calls.infer(client, "digits", item, retry)
    assert row.status == "failed" and len(seen) == 3
    assert row.error == {"status": 429, "error": "slow down", "attempts": 3}
