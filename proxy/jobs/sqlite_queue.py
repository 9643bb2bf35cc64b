"""The jobs' queue in an SQLite file: the embedded default (nothing to run beside the
proxy), shared by the proxy's own worker processes on one machine.

One connection on one thread per process; every change is one transaction (BEGIN IMMEDIATE,
so processes sharing the file take turns). WAL with synchronous=NORMAL: a committed job
survives the process being killed (not the machine losing power mid-write).

The WAL is copied back into the database by a connection and thread of its own, half a second
after a change (a PASSIVE checkpoint: it never holds up a writer), not by whichever commit
crosses SQLite's 1,000-page mark: that commit then waited for the copy and its fsync, and
enqueue's p99 at c=32 was 12-13 ms instead of 7-8.

A PASSIVE checkpoint never catches up with steady writes, and SQLite starts the WAL over only
once one has: under a flood of submissions the WAL grew ~25 MB a second (1 GB after 40 s, for
a 67 MB database) and kept its size afterwards. So once it holds more than `WAL_MB`, the
checkpoint RESTARTs it (the writer waits while the frames written since the last copy are
copied), and the WAL is cut back to `WAL_MB` when it starts over."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from proxy.jobs import sqlite_outbox, sqlite_schema
from proxy.jobs import sqlite_sql as sql
from proxy.jobs.grouping import Grouped
from proxy.jobs.model import CALLBACK_HOLD_S, Claimed, Job, QueueError, StoreFull, Submission
from proxy.jobs.queue import Depth, JobQueue, Page

T = TypeVar("T")
CHECKPOINT_S = 0.5
"""How long after a change the WAL is checkpointed (changes in between share it)."""
WAL_MB = 64
"""The WAL's size past which a checkpoint makes it start over, and to which it is cut then."""
POLL_S = 0.2
"""How soon an idle process sees a job another process submitted."""


class SqliteQueue(JobQueue):
    claim_wait_s = 30.0  # the workers' stop ends a waiting claim (stop_claims)

    def __init__(
        self,
        url: str,
        keep_s: float,
        callback_hold_s: float = CALLBACK_HOLD_S,
        min_free_bytes: int = 0,
    ) -> None:
        self.url = url
        self.keep_s = keep_s
        self.callback_hold_s = callback_hold_s
        self.min_free_bytes = min_free_bytes
        """Disk room no submission takes: a full disk stood the queue still (no claim, no
        end could be written, so no upload's room came back) until someone freed room."""
        self.path = Path(url.removeprefix("sqlite:///"))
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="jobs-sqlite")
        self._db: sqlite3.Connection | None = None
        self._wake = asyncio.Event()
        self._polling = False
        """One of this process's idle loops is the one looking every POLL_S."""
        self._looked = 0.0
        """When a loop of this process last looked and found no job (the loop's clock)."""
        self._stopped = False
        self._submit = Grouped(lambda group: self._run(self._submit_many, group))
        self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="jobs-checkpoint")
        self._checkpoint_db: sqlite3.Connection | None = None
        self._checkpoint: asyncio.Task[None] | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA wal_autocheckpoint=0")  # _checkpoint_soon's thread does it
            _limit_wal(db)
            sqlite_schema.create(db)
            self._db = db
        return self._db

    def _checkpoint_soon(self) -> None:
        if self._checkpoint is None or self._checkpoint.done():
            self._checkpoint = asyncio.create_task(self._copy_back())

    async def _copy_back(self, mode: str = "PASSIVE", delay_s: float | None = None) -> None:
        def copy() -> None:
            if self._checkpoint_db is None:
                self._checkpoint_db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
                _limit_wal(self._checkpoint_db)
            _, frames, _ = self._checkpoint_db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
            # Frames of SQLite's default 4 KiB page, each with its 24-byte header.
            if mode == "PASSIVE" and frames > WAL_MB * 2**20 // (4096 + 24):
                self._checkpoint_db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            elif mode == "PASSIVE" and frames and self._free_bytes() < 2 * self.min_free_bytes:
                # The disk is short: the WAL's file, all copied back, given back to it too
                # (a submission counts no room in it).
                self._checkpoint_db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

        await asyncio.sleep(CHECKPOINT_S if delay_s is None else delay_s)
        # On an error the next change tries again; meanwhile SQLite reads through the WAL.
        with contextlib.suppress(sqlite3.Error):
            await asyncio.get_running_loop().run_in_executor(self._checkpointer, copy)

    async def _run(self, work: Any, *args: Any) -> T:
        def inside() -> tuple[T, bool]:
            db = self._connect()
            before = db.total_changes
            db.execute("BEGIN IMMEDIATE")
            try:
                out = work(db, *args)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out, db.total_changes != before

        try:
            out, changed = await asyncio.get_running_loop().run_in_executor(self._thread, inside)
        except (sqlite3.Error, OSError) as exc:  # OSError: its folder cannot be made
            raise QueueError(f"the jobs' database {self.path}: {exc}") from exc
        if changed:  # only a change has frames to copy back (a read, an idle claim: none)
            self._checkpoint_soon()
        return out

    def _free_bytes(self) -> int:
        stat = os.statvfs(self.path.parent)
        return stat.f_bavail * stat.f_frsize

    def _submit_many(self, db: sqlite3.Connection, group: list) -> list:
        """`sql.submit_many` with the room the reserve leaves. An upload is written into the
        WAL (the disk's room), copied into the database (into pages ended jobs freed, or
        else the disk's room), and at its job's end written over with zeros in the WAL
        (SQLite's secure_delete, on in Debian's build). Taken already: what the WAL holds
        that the database file does not yet (its pages past the file's size), and the zeros
        of the uploads held."""
        if not self.min_free_bytes:
            return sql.submit_many(db, group)
        pages, freed, page_size = db.execute(
            "SELECT * FROM pragma_page_count, pragma_freelist_count, pragma_page_size"
        ).fetchone()
        pending = max(0, pages * page_size - self.path.stat().st_size)
        disk = self._free_bytes() - self.min_free_bytes - pending

        def room(held: int) -> int:  # `held`: the uploads held, read by submit_many
            left = disk - held
            return min(left // 2, (left + freed * page_size) // 3)

        return sql.submit_many(db, group, room)

    async def submit(
        self, job: Submission, max_queued: int, max_bytes: int = 0
    ) -> tuple[Job, bool]:
        try:
            return await self._submit((job, max_queued, max_bytes))
        except StoreFull as exc:
            room, size = exc.args
            raise QueueError(
                f"the jobs' database {self.path}: its disk takes {max(0, room) / 1e6:.1f} MB"
                f" more of uploads (each counted 3x: written, copied, zeroed at its job's end)"
                f" before the {self.min_free_bytes / 1e6:.0f} MB kept free"
                f" (PROXY_JOBS_MIN_FREE_MB), this one is {size / 1e6:.1f} MB: come back later"
            ) from None

    async def get(self, job_id: str) -> Job | None:
        return await self._run(sql.get, job_id, time.time())

    async def page(
        self, pipeline: str | None, status: str | None, limit: int, cursor: str | None
    ) -> Page:
        return await self._run(sql.page, pipeline, status, limit, cursor, time.time())

    async def cancel(self, job_id: str, keep_s: float) -> tuple[Job | None, bool]:
        return await self._run(sql.cancel, job_id, keep_s, time.time(), self.callback_hold_s)

    async def claim(self, lease_s: float, wait_s: float) -> Claimed | None:
        """A job claimed within `wait_s`, or None (at once after `stop_claims`). An idle
        process looks for jobs other processes submitted once every POLL_S, by one of its
        loops; the others wait to be woken (by a submission here, or a claim that found a
        job: more may have come with it) and look only then. Each loop looked on its own:
        an idle proxy with four made 11 transactions a second."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        # A loop back from a job looks at once, unless the poller looked just now.
        look = not self._polling or loop.time() - self._looked >= POLL_S
        if self._stopped:  # a loop that asks again must still yield to the others
            await asyncio.sleep(POLL_S)
        while not self._stopped:
            if look:
                claimed = await self._run(sql.claim, lease_s, self.keep_s, time.time())
                if claimed is not None:
                    self._wake.set()
                    return claimed
                self._looked = loop.time()
            left = until - loop.time()
            if left <= 0 or self._stopped:  # stopped while it looked: its wake not cleared
                return None
            self._wake.clear()
            polling, self._polling = not self._polling, True
            timeout, woken = min(left, POLL_S) if polling else left, False
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                    woken = True
            finally:
                if polling:
                    self._polling = False
            look = woken or polling
            if not look:  # waited its whole wait out
                return None
        return None

    def stop_claims(self) -> None:
        self._stopped = True
        self._wake.set()

    def allow_claims(self) -> None:
        self._stopped = False

    def notify(self) -> None:
        self._wake.set()

    async def renew(self, held: dict[str, str], lease_s: float) -> set[str]:
        return await self._run(sql.renew, held, time.time() + lease_s)

    async def finish(
        self, claimed: Claimed, status: str, result: Any, error: Any, keep_s: float
    ) -> bool:
        ended = (status, result, error, keep_s)
        return await self._run(sql.finish, claimed, ended, time.time(), self.callback_hold_s)

    async def requeue(self, claimed: Claimed, error: Any, delay_s: float) -> bool:
        return await self._run(sql.requeue, claimed, error, time.time(), delay_s)

    async def callback_done(self, job_id: str, outcome: str, retry_at: float | None) -> None:
        await self._run(sqlite_outbox.callback_done, job_id, outcome, retry_at)

    async def due_callbacks(self, now: float, most: int) -> list[str]:
        return await self._run(sqlite_outbox.due_callbacks, now, now + self.callback_hold_s, most)

    async def sweep(self, now: float, most: int) -> int:
        return await self._run(sql.sweep, now, most)

    async def depth(self) -> Depth:
        return await self._run(sql.depth, time.time())

    async def ping(self) -> None:
        await self._run(lambda db: db.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await self._submit.settle()  # submissions under way stored before the database shuts
        if self._checkpoint is not None:
            self._checkpoint.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoint
        if self._db is not None:
            await self._copy_back("TRUNCATE", delay_s=0)  # leave an empty WAL behind

        def forget() -> None:
            if self._checkpoint_db is not None:
                self._checkpoint_db.close()
                self._checkpoint_db = None

        await asyncio.get_running_loop().run_in_executor(self._checkpointer, forget)
        self._checkpointer.shutdown(wait=True)
        await asyncio.get_running_loop().run_in_executor(self._thread, shut)
        self._thread.shutdown(wait=True)


def _limit_wal(db: sqlite3.Connection) -> None:
    """The WAL cut back to WAL_MB whenever it starts over."""
    db.execute(f"PRAGMA journal_size_limit={WAL_MB * 2**20}")
