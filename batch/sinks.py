"""Where a batch's answers go: one row per input, appended as each answer arrives, to a
JSONL or CSV file. Rows are flushed one by one (a killed batch loses only the requests in
flight) and fsynced on close.

A rerun appends to the same file and skips every key it already holds (`answered()`); a row
torn by a kill mid-write is cut off first, so every key appears exactly once. With
`--retry-failed` the rows an earlier run gave up on (`gave_up`) are taken out first, and their
inputs sent again."""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

BASE_COLUMNS = ("key", "status", "latency_ms", "result", "error")


@dataclass(frozen=True)
class Row:
    key: str
    status: str
    """`ok` or `failed`."""
    latency_ms: float | None
    result: Any = None
    """What /infer answered (the whole answer: result, partial, steps)."""
    error: Any = None
    """{"status": HTTP status or null, "error": message}: the mesh's error, or the batch's."""
    extra: dict[str, str] | None = None

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "status": self.status,
            "latency_ms": self.latency_ms,
            "result": self.result,
            "error": self.error,
        }
        for name, value in (self.extra or {}).items():
            out[name if name not in out else f"input.{name}"] = value
        return out


def gave_up(status: str, error: Any) -> bool:
    """A row failed for the mesh's reasons after all its tries (a 429, 5xx or no answer each
    time; its error counts the attempts): another run may answer it. An input's own fault
    (a 4xx, a file too large) has no count: it would fail again."""
    return status == "failed" and isinstance(error, dict) and "attempts" in error


class SinkError(RuntimeError):
    """The output cannot be written (a full disk, a file gone read-only): the run stops
    (exit status 1), every row written before is kept, and a rerun resumes."""


class Sink:
    def answered(self) -> set[str]:
        """Keys already in the output (after cutting off a torn last row)."""
        raise NotImplementedError

    def write(self, row: Row) -> None:
        raise NotImplementedError

    def forget_given_up(self) -> int:
        """Take out the rows an earlier run gave up on (`gave_up`); how many."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _cut_torn_tail(path: Path) -> None:
    """A kill mid-write leaves a last line without its newline: cut it off."""
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        step = 1 << 16
        end = size
        while end > 0:
            start = max(0, end - step)
            f.seek(start)
            newline = f.read(end - start).rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return
            end = start
        f.truncate(0)


class _FileSink(Sink):
    """A file's rows, each written and flushed at once; a write the file refuses stops the
    run with the reason (before: a full disk ended the batch in a traceback, its flush
    failing again in close)."""

    path: Path
    _file: io.IOBase
    _failed = False

    def _append(self, data: bytes | str) -> None:
        try:
            self._file.write(data)
            self._file.flush()
        except OSError as exc:
            raise self._cannot(exc) from None

    def _open(self) -> None:
        raise NotImplementedError

    def _rewrite(self, write_kept: Callable[[Path], None]) -> None:
        """The file replaced by what `write_kept` writes to a spare (row by row: an output of
        OCR pages can be gigabytes), in one rename (a kill leaves the old or the new)."""
        self._file.close()
        spare = self.path.with_name(self.path.name + ".retrying")
        try:
            write_kept(spare)
            with spare.open("rb") as f:
                os.fsync(f.fileno())
            os.replace(spare, self.path)
        except OSError as exc:
            spare.unlink(missing_ok=True)  # a full disk: the old file stays as it was
            raise self._cannot(exc) from None
        finally:
            self._open()

    def _cannot(self, exc: OSError) -> SinkError:
        self._failed = True
        return SinkError(
            f"the output {self.path} cannot be written ({exc.strerror or exc}): the rows before"
            " are kept; rerun the same command to resume once it can be"
        )

    def close(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            if not self._failed:  # said once: a failed write has said it already
                raise self._cannot(exc) from None
        finally:
            with contextlib.suppress(OSError):  # its buffer's last try; the fd closes anyway
                self._file.close()


class JsonlSink(_FileSink):
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        _cut_torn_tail(path)
        self._open()

    def _open(self) -> None:
        self._file = self.path.open("ab")

    def answered(self) -> set[str]:
        keys: set[str] = set()
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    keys.add(orjson.loads(line)["key"])
        return keys

    def forget_given_up(self) -> int:
        with self.path.open("rb") as f:
            dropped = sum(1 for line in f if _line_gave_up(line))
        if dropped:
            self._rewrite(self._write_kept)
        return dropped

    def _write_kept(self, spare: Path) -> None:
        with self.path.open("rb") as f, spare.open("wb") as out:
            out.writelines(line for line in f if not _line_gave_up(line))

    def write(self, row: Row) -> None:
        self._append(orjson.dumps(row.fields(), option=orjson.OPT_APPEND_NEWLINE))


class CsvSink(_FileSink):
    """`result` and `error` as JSON text; the manifest's columns after the batch's own."""

    def __init__(self, path: Path, extra_columns: tuple[str, ...] = ()) -> None:
        self.path = path
        self.columns = [
            *BASE_COLUMNS,
            *(c if c not in BASE_COLUMNS else f"input.{c}" for c in extra_columns),
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        _cut_torn_tail(path)
        fresh = path.stat().st_size == 0
        self._open()
        if fresh:
            csv.DictWriter(self._file, self.columns).writeheader()
            self._file.flush()

    def _open(self) -> None:
        self._file = self.path.open("a", encoding="utf-8", newline="")

    def answered(self) -> set[str]:
        with self.path.open(encoding="utf-8", newline="") as f:
            return {row["key"] for row in csv.DictReader(f)}

    def forget_given_up(self) -> int:
        with self.path.open(encoding="utf-8", newline="") as f:
            dropped = sum(1 for row in csv.DictReader(f) if _row_gave_up(row))
        if dropped:
            self._rewrite(self._write_kept)
        return dropped

    def _write_kept(self, spare: Path) -> None:
        with (
            self.path.open(encoding="utf-8", newline="") as f,
            spare.open("w", encoding="utf-8", newline="") as out,
        ):
            reader = csv.DictReader(f)
            writer = csv.DictWriter(out, reader.fieldnames or self.columns)
            writer.writeheader()
            writer.writerows(row for row in reader if not _row_gave_up(row))

    def write(self, row: Row) -> None:
        fields = row.fields()
        for name in ("result", "error"):
            value = fields[name]
            fields[name] = "" if value is None else orjson.dumps(value).decode()
        buffer = io.StringIO()
        csv.DictWriter(buffer, self.columns, extrasaction="ignore").writerow(fields)
        self._append(buffer.getvalue())  # one write per row: a kill tears one row at most


def _line_gave_up(line: bytes) -> bool:
    """A JSONL row the run gave up on (`gave_up`)."""
    if not line.strip():
        return False
    row = orjson.loads(line)
    return gave_up(row["status"], row["error"])


def _row_gave_up(row: dict[str, str]) -> bool:
    """A CSV row the run gave up on: its `error` is JSON text ("" for none)."""
    return gave_up(row["status"], orjson.loads(row["error"]) if row["error"] else None)


def open_sink(spec: str, extra_columns: tuple[str, ...] = ()) -> Sink:
    path = Path(spec)
    if path.suffix == ".jsonl":
        return JsonlSink(path)
    if path.suffix == ".csv":
        return CsvSink(path, extra_columns)
    raise ValueError(f"{spec}: the output must be a .jsonl or .csv file")
