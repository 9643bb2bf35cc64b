"""Where a batch's inputs come from, streamed: a folder or glob of files, or a JSONL / CSV
manifest naming one file per line. Each input is read when its turn comes, so a batch of a
million files holds only the ones in flight; a source is walked twice (once to count, for the
progress bar's total and ETA), never held.

A key names an input in the output and across reruns: a file's path relative to the folder
(or the glob's fixed part), or the manifest's path as written."""

from __future__ import annotations

import asyncio
import csv
import glob
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

SMALL_FILE = 256 << 10
CSV_FIELD = 16 << 20
"""Longest CSV field read (Python's default, 128 KiB, is short for text passed through); a
longer one is recorded as that row's failure."""


class SourceError(ValueError):
    """The source itself cannot be read (not one of its inputs); the message says why."""


class NotSent(ValueError):
    """One input that cannot be sent (a FIFO, a device, a file over the size bound): recorded
    as its failure, the batch goes on."""


MAX_FILE_MB = 64.0
"""Largest file read (`--max-file-mb`): above the mesh's default body limit (20 MiB), so its
413 names the limit for the files between, while a stray disk image in the folder is refused
before it is read into memory."""
MAX_FILE_BYTES = int(MAX_FILE_MB * 2**20)


@dataclass(frozen=True)
class Input:
    key: str
    path: str | Path | None = None
    """The file to send; read when its turn comes."""
    extra: dict[str, str] = field(default_factory=dict)
    """A manifest's other columns, passed through to the output row."""
    problem: str | None = None
    """Why this input cannot be sent at all (recorded as its failure, the batch goes on)."""
    data: bytes | None = None
    """The image itself, when the source holds it (a database's bytes column)."""

    async def read(self, max_bytes: int = MAX_FILE_BYTES) -> bytes:
        """The image. A small file is read at once, a large one on a thread: a thread's round
        trip costs more than reading a photo of a few kilobytes (a 10 MB scan goes to the
        thread). One open and one fstat a file: the batch's CPU is taken from the mesh.

        Opened without blocking, and only a regular file is read: a FIFO in the folder would
        otherwise block the open (and with it the batch, Ctrl-C included) until something
        writes to it, and a device would be read without end."""
        if self.data is not None:
            return self.data
        assert self.path is not None
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb", buffering=0) as f:  # noqa: ASYNC230 (small: see above)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise NotSent(f"{self.path} is not a regular file ({_kind(info.st_mode)})")
            if info.st_size > max_bytes:
                raise NotSent(
                    f"{self.path} is {info.st_size / 2**20:.1f} MiB, over the "
                    f"{max_bytes / 2**20:g} MiB --max-file-mb"
                )
            if info.st_size < SMALL_FILE:
                return f.readall()
            return await asyncio.to_thread(f.readall)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a folder" if stat.S_ISDIR(mode) else "not a file"


class Source:
    """Inputs in a stable order; `count()` walks them without keeping them."""

    columns: tuple[str, ...] = ()
    """The extra columns every input carries (a manifest's, in its order)."""

    def __iter__(self) -> Iterator[Input]:
        raise NotImplementedError

    def count(self) -> int:
        return sum(1 for _ in self)


class Files(Source):
    """Every file under a folder (recursively, sorted), or every file a glob matches."""

    def __init__(self, spec: str, output: str | None = None) -> None:
        self.spec = spec
        # An output written beside the images (`photos/ -o photos/answers.jsonl`) is not one
        # of them: it was sent as an image, a failed row, and it grew while being walked.
        self._output = os.path.realpath(output) if output else None
        self._output_name = os.path.basename(self._output) if self._output else None
        if glob.has_magic(spec):
            fixed: list[str] = []
            for part in Path(spec).parts:
                if glob.has_magic(part):
                    break
                fixed.append(part)
            self.root = Path(*fixed) if fixed else Path(".")
        else:
            self.root = Path(spec)
            if not self.root.is_dir():
                raise SourceError(f"{spec}: not a folder, a glob, a .jsonl or a .csv manifest")

    def _paths(self) -> Iterator[str]:
        # Strings, not Paths: pathlib's parsing cost ~20 us a file, a tenth of the batch's
        # CPU per input, which on a shared machine is taken from the mesh.
        if glob.has_magic(self.spec):
            for name in glob.iglob(self.spec, recursive=True):
                if os.path.isfile(name) and not self._is_output(name):
                    yield name
            return
        for folder, dirs, files in os.walk(self.root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                if not self._is_output(path):
                    yield path

    def _is_output(self, path: str) -> bool:
        # The name first: a realpath (a few system calls) only for a file named as it is.
        return (
            os.path.basename(path) == self._output_name and os.path.realpath(path) == self._output
        )

    def __iter__(self) -> Iterator[Input]:
        root = os.path.join(self.root, "")
        for path in self._paths():
            key = path[len(root) :] if path.startswith(root) else os.path.relpath(path, self.root)
            yield Input(key if os.sep == "/" else key.replace(os.sep, "/"), path)

    def count(self) -> int:
        return sum(1 for _ in self._paths())


class Manifest(Source):
    """One input per line of a JSONL or CSV file: `path_column` names the file (relative to
    the manifest's folder unless absolute); the other columns go through to the output."""

    def __init__(self, path: Path, path_column: str = "path") -> None:
        self.path = path
        self.path_column = path_column
        if not path.is_file():
            raise SourceError(f"{path}: no such manifest")
        if path.suffix == ".csv":
            with path.open(newline="") as f:
                header = next(csv.reader(f), [])
            if path_column not in header:
                raise SourceError(f"{path}: no column '{path_column}' (columns: {header})")
            self.columns = tuple(c for c in header if c != path_column)

    def _records(self) -> Iterator[tuple[int, dict[str, object] | None, str | None]]:
        with self.path.open(newline="") as f:
            if self.path.suffix == ".csv":
                yield from _csv_rows(f)
                return
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield n, None, f"line {n} is not JSON ({exc.msg})"
                    continue
                if not isinstance(record, dict):
                    yield n, None, f"line {n} is not a JSON object"
                    continue
                yield n, record, None

    def __iter__(self) -> Iterator[Input]:
        for n, record, problem in self._records():
            if record is None:
                yield Input(f"{self.path.name}:{n}", problem=problem)
                continue
            named = record.get(self.path_column)
            extra = {k: _text(v) for k, v in record.items() if k != self.path_column}
            if not isinstance(named, str) or not named:
                said = "has no" if named in (None, "") else "has a non-text"
                problem = f"line {n} {said} '{self.path_column}'"
                yield Input(f"{self.path.name}:{n}", extra=extra, problem=problem)
                continue
            file = Path(named) if Path(named).is_absolute() else self.path.parent / named
            problem = None if file.is_file() else f"no such file: {named}"
            yield Input(named, None if problem else file, extra, problem)


def _csv_rows(f: TextIO) -> Iterator[tuple[int, dict[str, object] | None, str | None]]:
    """Each CSV row after the header; a row the reader refuses (a field over CSV_FIELD) is
    a problem of that row, and the reader goes on with the next."""
    if csv.field_size_limit() < CSV_FIELD:
        csv.field_size_limit(CSV_FIELD)
    reader = csv.DictReader(f)
    n = 1
    while True:
        n += 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield n, None, f"row {n} cannot be read: {exc}"
            continue
        yield n, dict(row), None


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def open_source(spec: str, path_column: str = "path", output: str | None = None) -> Source:
    """A folder, a glob or a manifest (a database: batch.sql.TableSource); a folder's or
    glob's files leave out `output`, the batch's own output file."""
    if spec.endswith((".jsonl", ".csv")):
        return Manifest(Path(spec), path_column)
    return Files(spec, output)
