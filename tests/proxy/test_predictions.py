"""The prediction log (PROXY_PREDICTION_LOG): each request a pipeline ended as one JSON record, in
a rotated file, POSTed to a real HTTP receiver as a CloudEvent or added to a real Redis stream;
never a request slowed, failed or lost for it."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import redis
from pydantic import ValidationError

from protos import codec
from protos.errors import InvalidInput
from proxy.engine import predictions
from proxy.engine.predictions_sinks import FileSink, Line
from proxy.engine.run import Ended
from proxy.settings import ProxySettings
from tests.conftest import redis_or_skip
from tests.proxy.scripted import ScriptedModel, affine
from tests.proxy.test_job_workers import wait_for
from tests.proxy.test_jobs import ended, submit
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post

RESULT = {"y": "a.y[0]"}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def _pipelines(servers) -> tuple[dict, dict[str, str]]:
    """`p` answers x + 1; `refused` is refused by its model (400)."""

    async def refuse(inputs, deadline):
        raise InvalidInput("no")

    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(affine("plus1", 1, 1), ScriptedModel("bad", refuse)),
    }
    pipes = {
        "p": pipeline([call("a", "plus1", "parse")], RESULT),
        "refused": pipeline([call("a", "bad", "parse")], RESULT),
    }
    return pipes, env


async def test_every_request_is_recorded_with_its_inputs_answer_and_steps(
    servers, make_client, tmp_path: Path
) -> None:
    pipes, env = await _pipelines(servers)
    path = tmp_path / "logs" / "predictions.jsonl"
    async with make_client(pipes, env, prediction_log=f"file://{path}") as client:
        answers = [
            await post(client, "p", body(1), **{"X-Request-Id": "first"}),
            await post(client, "p", body(2, 3)),
            await post(client, "refused", body(4)),
            await post(client, "nowhere", body(5)),  # no pipeline: nothing to record
        ]
    assert [a.status_code for a in answers] == [200, 200, 400, 404]
    records = _records(path)
    assert [(r["pipeline"], r["status"]) for r in records] == [
        ("p", 200),
        ("p", 200),
        ("refused", 400),
    ]
    assert [r["id"] for r in records] == [a.headers["X-Request-Id"] for a in answers[:3]]
    assert records[0]["id"] == "first"
    for record, answer, sent in zip(records[:2], answers[:2], [body(1), body(2, 3)], strict=True):
        assert record["result"] == answer.json()["result"]
        assert record["partial"] is False
        [upload] = record["inputs"].values()
        assert upload["sha256"] == [hashlib.sha256(sent).hexdigest()]  # the file's, as sent
        assert (upload["datatype"], upload["shape"], upload["bytes"]) == ("BYTES", [1], [len(sent)])
        assert "data_base64" not in upload  # digests only, unless asked
        assert [s["name"] for s in record["steps"]] == ["parse", "a"]
        assert [s["model"] for s in record["steps"]] == ["parse", "plus1"]  # the models called
        assert record["time"].endswith("Z") and record["latency_ms"] > 0
    refused = records[2]
    assert refused["result"] is None
    assert refused["steps"][-1]["status"] == "invalid_argument"
    assert "no" in refused["steps"][-1]["error"]


async def test_inputs_are_recorded_up_to_their_bound(servers, make_client, tmp_path) -> None:
    pipes, env = await _pipelines(servers)
    path = tmp_path / "predictions.jsonl"
    small, large = body(1), body(*range(300))  # 4 bytes, 1,200 bytes
    settings = {"prediction_log_inputs": True, "prediction_log_inputs_kb": 1}
    async with make_client(pipes, env, prediction_log=str(path), **settings) as client:
        assert (await post(client, "p", small)).status_code == 200
        assert (await post(client, "p", large)).status_code == 200
    first, second = (next(iter(r["inputs"].values())) for r in _records(path))
    assert [base64.b64decode(d) for d in first["data_base64"]] == [small]
    assert "data_base64" not in second and second["bytes"] == [len(large)]


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict, bytes]], list[int]]]:
    """A real HTTP server on 127.0.0.1 keeping what is POSTed to it; the status it answers
    is the list's last (202 until a test says otherwise)."""
    got: list[tuple[dict, bytes]] = []
    status = [202]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            got.append((dict(self.headers), self.rfile.read(length)))
            self.send_response(status[-1])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/events", got, status
    finally:
        server.shutdown()
        server.server_close()


async def test_records_are_posted_as_cloudevents(servers, make_client, receiver) -> None:
    url, got, status = receiver
    pipes, env = await _pipelines(servers)
    failed = predictions.RECORDS.labels("failed")
    before = failed._value.get()
    async with make_client(pipes, env, prediction_log=url) as client:
        ok = await post(client, "p", body(7), **{"X-Request-Id": "evented"})
        for _ in range(100):  # sent in the background: wait for it, then refuse the next
            if got:
                break
            await asyncio.sleep(0.02)
        status.append(500)
        refused_by_receiver = await post(client, "p", body(8))
    assert ok.status_code == 200 and refused_by_receiver.status_code == 200
    assert len(got) == 2
    headers, content = got[0]
    headers = {k.lower(): v for k, v in headers.items()}
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-type"] == "io.inference-mesh.prediction"
    assert headers["ce-source"] == "/inference-mesh/pipelines/p"
    assert headers["ce-requestid"] == "evented"
    assert headers["content-type"] == "application/json"
    record = json.loads(content)
    assert headers["ce-time"] == record["time"]
    assert record["id"] == "evented" and record["result"] == ok.json()["result"]
    other = {k.lower(): v for k, v in got[1][0].items()}
    assert headers["ce-id"] != other["ce-id"]  # one event each
    assert failed._value.get() - before == 1  # the receiver's 500: counted, not retried


async def test_a_sink_that_never_answers_holds_no_request(
    servers, make_client, monkeypatch
) -> None:
    """A receiver that accepts and never answers: every request is answered at once, the
    records beyond the queue's bound are dropped and counted, and the proxy still stops."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    monkeypatch.setattr(predictions, "MAX_QUEUED", 5)
    monkeypatch.setattr(predictions, "CLOSE_S", 0.5)
    dropped, written = (predictions.RECORDS.labels(o) for o in ("dropped", "written"))
    before = dropped._value.get(), written._value.get()
    pipes, env = await _pipelines(servers)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
    try:
        async with make_client(pipes, env, prediction_log=url) as client:
            answers = await asyncio.gather(*(post(client, "p", body(i)) for i in range(30)))
    finally:
        silent.close()
    assert [a.status_code for a in answers] == [200] * 30
    # The first batch hangs at the receiver, at most MAX_QUEUED records wait behind it (and
    # are dropped when the proxy stops): the rest were dropped as they came.
    assert dropped._value.get() - before[0] >= 30 - 2 * 5
    assert written._value.get() == before[1]


def test_a_sink_that_is_neither_a_file_nor_http_nor_redis_is_named_at_start() -> None:
    with pytest.raises(ValidationError, match="'kafka://x' is neither a file"):
        ProxySettings(prediction_log="kafka://x")
    with pytest.raises(ValidationError, match="maxlen must be a whole number above 0"):
        ProxySettings(prediction_log="redis://127.0.0.1:6379/0?maxlen=ten")
    with pytest.raises(ValidationError, match="names an empty stream"):
        ProxySettings(prediction_log="redis://127.0.0.1:6379/0?stream=")
    with pytest.raises(ValidationError, match="names no absolute path"):
        ProxySettings(prediction_log="file://relative/p.jsonl")


def test_two_processes_rotating_one_file_lose_and_mix_no_line(tmp_path: Path) -> None:
    """Two sinks on one file (two proxy workers) in threads, rotating at 4 KiB (~45 records):
    every line is a whole record, none written twice, the newest kept in the file and
    `.1`-`.5`, nothing older (~36 KiB written)."""
    path = tmp_path / "p.jsonl"
    sinks = [FileSink(path, 4096), FileSink(path, 4096)]

    def write(which: int) -> None:
        for i in range(200):
            record = json.dumps({"writer": which, "i": i, "pad": "x" * 60}).encode() + b"\n"
            asyncio.run(sinks[which].write([Line(str(i), "p", "t", record)]))

    threads = [threading.Thread(target=write, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    files = [path, *(Path(f"{path}.{i}") for i in range(1, 6))]
    assert all(f.exists() for f in files)
    assert not Path(f"{path}.6").exists()
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    seen = [(r["writer"], r["i"]) for r in lines]
    assert len(seen) == len(set(seen))  # none twice, each whole (json.loads read it)
    assert all(f.stat().st_size < 4096 + 100 for f in files)
    newest = {(w, 199) for w in (0, 1)}
    assert newest <= set(seen)


_FULL_DISK = """
import asyncio, json, resource, signal, sys
from pathlib import Path
from proxy.engine.predictions_sinks import FileSink, Line

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
path = Path(sys.argv[1])
sink = FileSink(path, 1 << 30)

def batch(first: int) -> list[Line]:
    return [
        Line(str(i), "p", "t", json.dumps({"i": i, "pad": "x" * 90}).encode() + b"\\n")
        for i in range(first, first + 10)
    ]

written = [asyncio.run(sink.write(batch(0)))]
resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 500, resource.RLIM_INFINITY))
written.append(asyncio.run(sink.write(batch(10))))  # ~1 KiB: cut off after ~500 bytes
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
written.append(asyncio.run(sink.write(batch(20))))
print(json.dumps(written))
"""


def test_a_write_cut_short_by_a_full_disk_leaves_no_torn_line(tmp_path: Path) -> None:
    """The file's size limit reached in the middle of a batch (as a full disk does): that
    batch is not written, is counted as such, and leaves nothing of itself behind, so the
    next batch's lines are whole (a torn line joined to the next record was unreadable)."""
    path = tmp_path / "p.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(path)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [10, 0, 10]
    records = [json.loads(line)["i"] for line in path.read_text().splitlines()]
    assert records == [*range(10), *range(20, 30)]


async def test_a_jobs_run_is_recorded_under_its_attempts_id(
    servers, make_client, tmp_path: Path
) -> None:
    pipes, env = await _pipelines(servers)
    path = tmp_path / "predictions.jsonl"
    jobs = {"jobs_workers": 1, "jobs_url": f"sqlite:///{tmp_path / 'jobs.sqlite3'}"}
    async with make_client(pipes, env, prediction_log=str(path), **jobs) as client:
        accepted = await submit(client, "p", body(3))
        done = await ended(client, accepted.json()["id"])
    [record] = _records(path)
    assert record["id"] == f"job-{done['id']}-1" == done["result"]["id"]
    assert record["result"] == done["result"]["result"] == {"y": [4.0]}


async def test_records_are_added_to_a_redis_stream_trimmed_to_its_length(
    servers, make_client, redis_db
) -> None:
    """Each record one entry of the stream the URL names (the rest of the URL is Redis's
    own), its fields what a consumer filters on and the record's JSON; the stream kept near
    `maxlen` entries however many come."""
    pipes, env = await _pipelines(servers)
    store = redis.Redis.from_url(redis_db.url)
    stream = f"predictions-{uuid.uuid4().hex}"
    url = f"{redis_db.url}?stream={stream}&maxlen=20&socket_keepalive=true"
    async with make_client(pipes, env, prediction_log=url) as client:
        first = await post(client, "p", body(1), **{"X-Request-Id": "streamed"})
        refused = await post(client, "refused", body(2))
        more = await asyncio.gather(*(post(client, "p", body(i)) for i in range(300)))
    assert [first.status_code, refused.status_code] == [200, 400]
    assert {a.status_code for a in more} == {200}
    [(_, fields)] = store.xrange(stream, count=1)  # the oldest kept: trimmed by now
    assert set(fields) == {b"id", b"pipeline", b"time", b"record"}
    entries = store.xrange(stream)
    assert 20 <= len(entries) < 302  # trimmed (about: by whole nodes of entries)
    records = [json.loads(f[b"record"]) for _, f in entries]
    assert all(json.loads(f[b"record"])["id"] == f[b"id"].decode() for _, f in entries)
    assert {r["id"] for r in records} <= {a.headers["X-Request-Id"] for a in more}
    assert {r["result"]["y"][0] for r in records} <= {i + 1.0 for i in range(300)}
    store.delete(stream)
    store.close()


async def test_a_redis_stream_gone_fails_records_not_requests(
    servers, make_client, tmp_path: Path
) -> None:
    """Redis stopped under a logging proxy: every request is still answered, the records
    sent meanwhile are counted failed, and the ones after Redis is back are written."""
    own = redis_or_skip(tmp_path)
    pipes, env = await _pipelines(servers)
    failed, written = (predictions.RECORDS.labels(o) for o in ("failed", "written"))
    stream = "mesh:predictions"  # the default
    store = redis.Redis.from_url(own.url)
    try:
        async with make_client(pipes, env, prediction_log=own.url) as client:
            before = await post(client, "p", body(1), **{"X-Request-Id": "before"})
            await wait_for(lambda: store.xlen(stream) == 1)  # written after the answer
            assert store.xlen(stream) == 1
            own.stop()
            lost_before = failed._value.get()
            gone = [await post(client, "p", body(2 + i)) for i in range(5)]
            await wait_for(lambda: failed._value.get() - lost_before == 5)
            own.restart()
            kept_before = written._value.get()
            back = await post(client, "p", body(9), **{"X-Request-Id": "after"})
            await wait_for(lambda: written._value.get() > kept_before)
        ids = [f[b"id"] for _, f in store.xrange(stream)]
    finally:
        store.close()
        own.stop()
    assert [a.status_code for a in (before, *gone, back)] == [200] * 7
    assert failed._value.get() - lost_before == 5
    assert b"after" in ids  # a fresh connection once Redis is back


def _ended(inputs: dict[str, np.ndarray]) -> Ended:
    """A request refused with 400 after its inputs were read: a record of its inputs."""
    return Ended("p", "req-1", "400", time.perf_counter(), [], None, inputs)


def _bytes_tensor(elements: list[bytes]) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array


async def test_large_inputs_are_described_off_the_loop_many_elements_as_a_whole(
    tmp_path: Path, monkeypatch
) -> None:
    """A 2 MiB upload and a BYTES tensor of 5,000 elements are hashed in a worker thread,
    the latter over its v2 contents as a whole; a small upload on the loop, element by
    element. Each record's digests are those of what was sent."""
    threads: list[str] = []
    describe = predictions.PredictionLog._inputs

    def watched(self, inputs):
        threads.append(threading.current_thread().name)
        return describe(self, inputs)

    monkeypatch.setattr(predictions.PredictionLog, "_inputs", watched)
    path = tmp_path / "p.jsonl"
    log = predictions.PredictionLog(FileSink(path, 1 << 30), lambda run: None, with_inputs=True)
    big, small = os.urandom(2 << 20), b"small"
    many = [f"word {i}".encode() for i in range(5000)]
    for inputs in ({"image": _bytes_tensor([big])}, {"words": _bytes_tensor(many)}):
        log.add(_ended(inputs))
    log.add(_ended({"image": _bytes_tensor([small])}))
    await log.close()
    assert threads[0] == threading.main_thread().name  # the small one, made at once
    assert all(t != threading.main_thread().name for t in threads[1:]) and len(threads) == 3
    records = [r["inputs"] for r in _records(path)]
    assert len(records) == 3
    uploads = {r["image"]["bytes"][0]: r["image"] for r in records if "image" in r}
    assert uploads[len(small)]["sha256"] == [hashlib.sha256(small).hexdigest()]
    assert base64.b64decode(uploads[len(small)]["data_base64"][0]) == small
    raw = codec.to_raw_view(_bytes_tensor(many))[1]
    [words] = [r["words"] for r in records if "words" in r]
    assert (words["sha256"], words["bytes"]) == (hashlib.sha256(raw).hexdigest(), len(raw))
    assert base64.b64decode(words["data_base64"]) == raw
    upload = uploads[len(big)]
    assert upload["sha256"] == [hashlib.sha256(big).hexdigest()]
    assert "data_base64" not in upload  # over PROXY_PREDICTION_LOG_INPUTS_KB: its digest only
