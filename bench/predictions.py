"""`python -m bench predictions`: what the prediction log (PROXY_PREDICTION_LOG,
proxy/engine/predictions.py) costs `digits`, measured in one run, rounds interleaved: three
proxies of the same kind over one shipped mesh, one without a log, one recording every request
to a file (digests of the uploads), one recording the uploads' bytes too, and one adding each
record to a Redis stream (Debian's redis-server on 127.0.0.1; left out without it). A record is made
after its answer, on the same loop: the cost to expect is its making (the result rendered
again, the upload hashed, a JSON line) and a file write every batch. Then what each log
counted and the lines it wrote."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path

import redis

from bench import redis_server
from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import HEADER, http_closed_loop, interleaved, row, second_proxy, shipped_mesh
from bench.services import metric_of
from bench.shadow import PATH, digits


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="what the prediction log costs digits")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args(argv)
    blobs = digits(64)
    folder = Path(tempfile.mkdtemp(prefix="bench-predictions-"))
    digests, uploads = folder / "digests.jsonl", folder / "uploads.jsonl"
    entries = 0
    with shipped_mesh("bench-predictions") as mesh, contextlib.ExitStack() as stack:
        env = mesh.services["proxy"].env
        # The rotation's size above what a run writes: every line stays in one file to count.
        logged = {**env, "PROXY_PREDICTION_LOG_FILE_MB": "4096"}
        with_uploads = {"PROXY_PREDICTION_LOG": str(uploads), "PROXY_PREDICTION_LOG_INPUTS": "1"}
        plain = stack.enter_context(second_proxy(env))
        hashed = stack.enter_context(second_proxy({**logged, "PROXY_PREDICTION_LOG": str(digests)}))
        kept = stack.enter_context(second_proxy({**logged, **with_uploads}))
        systems = {"no log": plain, "log, digests": hashed, "log, uploads too": kept}
        stream = None
        if redis_server.available():
            stream = redis_server.start(folder / "redis", max_mb=1024)
            stack.callback(stream.stop)
            to_redis = {**env, "PROXY_PREDICTION_LOG": f"{stream.url}?maxlen=100000"}
            systems["log to a Redis stream"] = stack.enter_context(second_proxy(to_redis))

        def load(url: str, c: int) -> Stats:
            raw = [post_bytes(url + PATH, b, "image/png") for b in blobs]
            return asyncio.run(http_closed_loop(url, raw, c, args.duration))

        table = interleaved(systems, load, tuple(args.concurrency), args.rounds)
        records = "proxy_prediction_log_records_total"
        logging = (("digests", hashed), ("uploads too", kept))
        if stream is not None:
            logging += (("Redis", systems["log to a Redis stream"]),)
        counted = {
            f"{name}: {outcome}": metric_of(url, records, outcome=outcome)
            for name, url in logging
            for outcome in ("written", "dropped", "failed")
        }
        if stream is not None:
            entries = redis.Redis.from_url(stream.url).xlen("mesh:predictions")
    print("\n### `digits` with a prediction log\n")
    print(HEADER)
    for c, stats in table.items():
        base = stats["no log"]
        for label, s in stats.items():
            print(row(label, c, s, base))
    print("\nCounted by the logging proxies over the whole run:")
    for name, value in counted.items():
        print(f"- {name}: {value:,.0f}")
    for path in (digests, uploads):
        lines = path.read_bytes().count(b"\n") if path.exists() else 0
        size = path.stat().st_size if path.exists() else 0
        print(f"- {path.name}: {lines:,} lines, {size / lines if lines else 0:,.0f} bytes a line")
    if stream is not None:
        print(f"- the Redis stream: {entries:,} entries (trimmed to about 100,000)")
    return 0
