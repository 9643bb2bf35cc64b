"""`python -m batch PIPELINE SOURCE -o SINK` (also `mesh-batch`, `./mesh batch`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import uvloop

from batch.calls import Retry
from batch.progress import Progress
from batch.runner import MeshError, Options, run
from batch.sinks import Sink, open_sink
from batch.sources import MAX_FILE_MB, Source, SourceError, open_source

DEFAULT_URL = "http://127.0.0.1:8080"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mesh batch",
        description="Run a pipeline of the mesh over many inputs; rerun to resume.",
    )
    p.add_argument("pipeline", help="the pipeline to run, e.g. digits or ocr")
    p.add_argument(
        "source",
        help="a folder, a glob (quoted), a .jsonl / .csv manifest, or a SQLAlchemy URL "
        "(with --table or --query, --key, --image)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="a .jsonl or .csv file (appended), or a SQLAlchemy URL with --output-table",
    )
    p.add_argument("--table", help="a database source's table")
    p.add_argument("--query", help="a database source's SELECT (instead of --table)")
    p.add_argument("--key", default="id", help="a database source's key column (id)")
    p.add_argument("--image", default="image", help="its image column: bytes or a path (image)")
    p.add_argument("--output-table", help="a database sink's table (made if missing)")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the mesh's proxy (default {DEFAULT_URL})")
    p.add_argument(
        "--door",
        choices=("rest", "grpc"),
        default="rest",
        help="the mesh's REST door (default: as fast, and its whole answer) or its gRPC door's "
        "streams",
    )
    p.add_argument(
        "--grpc", metavar="HOST:PORT", help="the gRPC door (default: --url's host, port 8081)"
    )
    p.add_argument("--path-column", default="path", help="a manifest's file column (path)")
    p.add_argument("-c", "--concurrency", type=int, default=32, help="requests in flight (32)")
    p.add_argument("--rate", type=float, help="requests started per second at most")
    p.add_argument("--attempts", type=int, default=5, help="tries per input on 429/502/503/504 (5)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request (120)")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="send again the inputs earlier runs gave up on after --attempts tries (429, "
        "5xx, no answer); an input's own failures (4xx, too large) stay",
    )
    p.add_argument(
        "--max-failed",
        type=float,
        metavar="FRACTION",
        help="exit 1 when more than this fraction of the inputs sent failed (e.g. 0.01)",
    )
    p.add_argument(
        "--max-file-mb",
        type=float,
        default=MAX_FILE_MB,
        help=f"larger files are failed rows, never read ({MAX_FILE_MB:g})",
    )
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds between log lines")
    return p


def _is_url(spec: str) -> bool:
    return "://" in spec


def _source(args: argparse.Namespace) -> Source:
    if not _is_url(args.source):
        if args.table or args.query:
            raise SourceError("--table and --query name a database source's rows: give a URL")
        return open_source(
            args.source, args.path_column, None if _is_url(args.output) else args.output
        )
    from batch.sql import TableSource  # SQLAlchemy only when a database is named

    return TableSource(
        args.source, table=args.table, query=args.query, key=args.key, image=args.image
    )


def _sink(args: argparse.Namespace, columns: tuple[str, ...]) -> Sink:
    if not _is_url(args.output):
        return open_sink(args.output, columns)
    if not args.output_table:
        raise SourceError("a database output needs --output-table")
    from batch.sql import TableSink

    return TableSink(args.output, args.output_table)


def _opened(args: argparse.Namespace) -> tuple[Source, Sink]:
    source = _source(args)
    sink = _sink(args, source.columns)
    if _is_url(args.source) and _is_url(args.output):
        from batch.sql import TableSink, TableSource

        if isinstance(source, TableSource) and isinstance(sink, TableSink):
            source.skip_answered_in(sink)
    return source, sink


RESUME_WAITS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Waits before each resume of a run whose database stopped answering (~1 minute in all): a
restart or a fail-over of PostgreSQL no longer ends a run of hours."""


async def _resuming(
    args: argparse.Namespace, source: Source, sink: Sink, options: Options
) -> Progress:
    """The run, resumed as a rerun would be (what the output holds is skipped) each time its
    database stops answering, until it answers again or RESUME_WAITS_S run out."""
    if not (_is_url(args.source) or _is_url(args.output)):
        return await run(source, sink, options)
    from batch.sql import Disconnected  # SQLAlchemy only when a database is named

    while True:
        try:
            return await run(source, sink, options)
        except Disconnected as exc:
            error: Exception = exc
        waits = iter(RESUME_WAITS_S)  # afresh for each loss: a run of days may meet several
        while True:  # wait, then open both again, until they open or the waits run out
            wait = next(waits, None)
            if wait is None:
                raise RuntimeError(f"{error} (gave up after {len(RESUME_WAITS_S)} waits)")
            print(f"mesh batch: {error}; resuming in {wait:g} s", file=sys.stderr)
            await asyncio.sleep(wait)
            try:
                source, sink = _opened(args)
                break
            except SourceError as exc:  # still down
                error = exc


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if (
        args.concurrency < 1
        or args.attempts < 1
        or (args.rate is not None and args.rate <= 0)
        or args.max_file_mb <= 0
    ):
        print(
            "mesh batch: --concurrency, --attempts, --rate and --max-file-mb must be positive",
            file=sys.stderr,
        )
        return 2
    try:
        source, sink = _opened(args)
    except (SourceError, ValueError, OSError) as exc:
        print(f"mesh batch: {exc}", file=sys.stderr)
        return 2
    options = Options(
        url=args.url,
        pipeline=args.pipeline,
        concurrency=args.concurrency,
        rate=args.rate,
        retry=Retry(attempts=args.attempts),
        timeout_s=args.timeout,
        progress_every_s=args.progress_every,
        max_file_bytes=int(args.max_file_mb * 2**20),
        retry_failed=args.retry_failed,
        door=args.door,
        grpc_address=args.grpc,
        # From the environment, not a flag: a key on the command line shows in `ps`.
        api_key=os.environ.get("MESH_API_KEY") or None,
    )

    async def batch() -> int:
        task = asyncio.current_task()
        assert task is not None
        # SIGTERM (a CronJob's pod stopping) ends the run like Ctrl-C: answered rows kept.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            progress = await _resuming(args, source, sink, options)
        except MeshError as exc:
            print(f"mesh batch: {exc}", file=sys.stderr)
            return 2
        except (RuntimeError, SourceError) as exc:  # the output or the source failed
            print(f"mesh batch: {exc}", file=sys.stderr)
            return 1
        except asyncio.CancelledError:
            print("mesh batch: stopped; rerun the same command to resume", file=sys.stderr)
            return 130
        progress.close()
        sent = progress.sent
        failed = progress.counts["failed"]
        if args.max_failed is not None and sent and failed / sent > args.max_failed:
            print(
                f"mesh batch: {failed} of {sent} failed, more than --max-failed {args.max_failed}",
                file=sys.stderr,
            )
            return 1
        return 0

    try:
        # uvloop: ~10% less of this process's CPU per input, which on a shared machine is CPU
        # the mesh answering it gets (bench batch).
        return uvloop.run(batch())
    except KeyboardInterrupt:
        print("mesh batch: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
