"""The SQL of the jobs' SQLite queue (sqlite_queue.py): each function runs on the queue's
thread inside one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from proxy.jobs.model import (
    Claimed,
    IdempotencyConflict,
    Job,
    QueueFull,
    StoreFull,
    Submission,
    dumps,
    loads,
    new_id,
)
from proxy.jobs.queue import Depth, Page

COLUMNS = (
    "id, pipeline, status, created, updated, attempts, max_attempts, budget_ms, result, error,"
    " callback, callback_status, finished"
)
LOST = {"status": 503, "error": "the worker running the job stopped, {n} times"}


def _job(row: tuple) -> Job:
    (id_, pipeline, status, created, updated, attempts, max_attempts, budget, result, error,
     callback, callback_status, finished) = row  # fmt: skip
    return Job(
        id_, pipeline, status, created, updated, attempts, max_attempts, budget,
        loads(result), loads(error), callback, callback_status, finished,
    )  # fmt: skip


def submit_many(
    db: sqlite3.Connection,
    batch: list[tuple[Submission, int, int]],
    room: Callable[[int], int] | None = None,
) -> list[tuple[Job, bool] | Exception]:
    """Each submission in turn, in one transaction: its job, or why it was refused (`room`:
    the upload bytes the disk can take beyond its reserve, given those held). The
    bound's counts are read and written once for the group and its rows inserted together:
    four statements a job were most of the queue thread's time under a flood of submissions."""
    counts = dict(db.execute("SELECT name, value FROM counts").fetchall())
    unfinished, held = counts["unfinished"], max(0, counts["queued_bytes"])
    most = None if room is None else room(held)
    outcomes: list[tuple[Job, bool] | Exception] = []
    rows: list[tuple] = []
    uploads: list[tuple[str, bytes]] = []
    taken = 0
    """The bytes of this group's uploads."""
    keyed: dict[str, tuple[Submission, Job]] = {}
    """This group's new jobs by Idempotency-Key (not in the table until the group is)."""
    for job, max_queued, max_bytes in batch:
        try:
            earlier = _idempotent(db, job, keyed)
            if earlier is not None:
                outcomes.append((earlier, False))
                continue
            if unfinished >= max_queued:
                raise QueueFull(f"{unfinished} unfinished jobs")
            if max_bytes and held + len(job.payload) > max_bytes:
                raise QueueFull(f"{held} bytes of uploads waiting, the limit {max_bytes}")
            if most is not None and taken + len(job.payload) > most:
                raise StoreFull(most - taken, len(job.payload))
        except (QueueFull, IdempotencyConflict, StoreFull) as exc:
            outcomes.append(exc)
            continue
        unfinished += 1
        held += len(job.payload)
        taken += len(job.payload)
        rows.append(
            (job.id, job.pipeline, job.created, job.created, job.created, job.max_attempts,
             job.budget_ms, job.kind, job.callback, job.idempotency_key, job.digest,
             job.traceparent)
        )  # fmt: skip
        uploads.append((job.id, job.payload))
        stored = Job(job.id, job.pipeline, "queued", job.created, job.created, 0,
                     job.max_attempts, job.budget_ms, callback=job.callback)  # fmt: skip
        if job.idempotency_key is not None:
            keyed[job.idempotency_key] = (job, stored)
        outcomes.append((stored, True))
    if rows:
        db.executemany(
            "INSERT INTO jobs (id, pipeline, status, created, updated, due, max_attempts,"
            " budget_ms, kind, callback, idem, digest, traceparent)"
            " VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        db.executemany("INSERT INTO uploads VALUES (?, ?)", uploads)
        _ended(db, -len(rows))
        _held(db, taken)
    return outcomes


def _idempotent(
    db: sqlite3.Connection, job: Submission, keyed: dict[str, tuple[Submission, Job]]
) -> Job | None:
    """The job this submission's Idempotency-Key already names (stored, or new in this
    group), if its pipeline and body are the same; IdempotencyConflict if not."""
    key = job.idempotency_key
    if key is None:
        return None
    if key in keyed:
        first, stored = keyed[key]
        if first.pipeline != job.pipeline or first.digest != job.digest:
            raise IdempotencyConflict(stored.id)
        return stored
    row = db.execute("SELECT pipeline, digest, id FROM jobs WHERE idem = ?", (key,)).fetchone()
    if row is None:
        return None
    if row[0] != job.pipeline or row[1] != job.digest:
        raise IdempotencyConflict(row[2])
    found = get(db, row[2], None)
    assert found is not None
    return found


OUTBOX = "callback_due = CASE WHEN callback IS NULL THEN NULL ELSE ? END"
"""A final state's write puts a job with a callback in the outbox, due then."""


def get(db: sqlite3.Connection, job_id: str, now: float | None) -> Job | None:
    row = db.execute(f"SELECT {COLUMNS}, expires FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None or (now is not None and row[-1] is not None and row[-1] <= now):
        return None
    return _job(row[:-1])


def page(
    db: sqlite3.Connection,
    pipeline: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
    now: float,
) -> Page:
    where, args = ["(expires IS NULL OR expires > ?)"], [now]
    if pipeline is not None:
        where.append("pipeline = ?")
        args.append(pipeline)
    if status is not None:
        where.append("status = ?")
        args.append(status)
    if cursor is not None:
        created, _, last = cursor.partition(":")
        where.append("(created < ? OR (created = ? AND id < ?))")
        args += [float(created), float(created), last]
    rows = db.execute(
        f"SELECT {COLUMNS} FROM jobs WHERE {' AND '.join(where)}"
        " ORDER BY created DESC, id DESC LIMIT ?",
        (*args, limit + 1),
    ).fetchall()
    jobs = [_job(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(jobs, f"{jobs[-1].created!r}:{jobs[-1].id}" if more else None)


def cancel(
    db: sqlite3.Connection, job_id: str, keep_s: float, now: float, hold_s: float
) -> tuple[Job | None, bool]:
    done = db.execute(
        "UPDATE jobs SET status = 'cancelled', updated = ?, finished = ?, token = NULL,"
        f" expires = ?, {OUTBOX} WHERE id = ? AND status IN ('queued', 'running')",
        (now, now, now + keep_s, now + hold_s, job_id),
    )
    _ended(db, done.rowcount)
    if done.rowcount:
        _dropped(db, job_id)
    return get(db, job_id, now), done.rowcount == 1


def claim(db: sqlite3.Connection, lease_s: float, keep_s: float, now: float) -> Claimed | None:
    while True:
        # The oldest due job of each kind, each read in the index's order (one OR of the two
        # made SQLite sort every due job for each claim: O(backlog) a claim).
        rows = [
            db.execute(
                "SELECT due, id, status, attempts, max_attempts FROM jobs"
                f" WHERE status = '{status}' AND due {op} ? ORDER BY due LIMIT 1",
                (now,),
            ).fetchone()
            for status, op in (("queued", "<="), ("running", "<"))
        ]
        found = [r for r in rows if r is not None]
        if not found:
            return None
        _, job_id, status, attempts, max_attempts = min(found)
        if status == "running" and attempts >= max_attempts:
            # Its worker died on its last attempt: failed, with why.
            error = {**LOST, "error": LOST["error"].format(n=attempts)}
            _dropped(db, job_id)
            # Nobody sends its callback at once: the outbox's next look does.
            db.execute(
                "UPDATE jobs SET status = 'failed', updated = ?, finished = ?, token = NULL,"
                f" error = ?, expires = ?, {OUTBOX} WHERE id = ?",
                (now, now, dumps(error), now + keep_s, now, job_id),
            )
            _ended(db, 1)
            continue
        token = new_id()
        db.execute(
            "UPDATE jobs SET status = 'running', token = ?, due = ?, updated = ?,"
            " attempts = attempts + 1 WHERE id = ?",
            (token, now + lease_s, now, job_id),
        )
        kind, payload, traceparent = db.execute(
            "SELECT kind, COALESCE(uploads.payload, jobs.payload), traceparent FROM jobs"
            " LEFT JOIN uploads USING (id) WHERE id = ?", (job_id,)
        ).fetchone()  # fmt: skip
        job = get(db, job_id, None)
        assert job is not None
        return Claimed(job, kind, payload, token, traceparent)


def renew(db: sqlite3.Connection, held: dict[str, str], until: float) -> set[str]:
    lost = set()
    for job_id, token in held.items():
        done = db.execute(
            "UPDATE jobs SET due = ? WHERE id = ? AND token = ? AND status = 'running'",
            (until, job_id, token),
        )
        if done.rowcount == 0:
            lost.add(job_id)
    return lost


def finish(
    db: sqlite3.Connection,
    claimed: Claimed,
    ended: tuple[str, Any, Any, float],
    now: float,
    hold_s: float,
) -> bool:
    """`ended`: the status, result, error and time to keep."""
    status, result, error, keep_s = ended
    # The token stays: the same claim's finish sent again (its first answer lost) is then
    # known for what it is, and answered True again (redis_scripts.FINISH does the same).
    done = db.execute(
        "UPDATE jobs SET status = ?, result = ?, error = ?, updated = ?, finished = ?,"
        f" expires = ?, {OUTBOX}"
        " WHERE id = ? AND token = ? AND status = 'running'",
        (status, None if result is None else dumps(result), None if error is None else dumps(error),
         now, now, now + keep_s, now + hold_s, claimed.job.id, claimed.token),
    )  # fmt: skip
    _ended(db, done.rowcount)
    if done.rowcount == 1:
        _dropped(db, claimed.job.id)
        return True
    again = "SELECT 1 FROM jobs WHERE id = ? AND token = ? AND status = ?"
    return db.execute(again, (claimed.job.id, claimed.token, status)).fetchone() is not None


def requeue(
    db: sqlite3.Connection, claimed: Claimed, error: Any, now: float, delay_s: float
) -> bool:
    done = db.execute(
        "UPDATE jobs SET status = 'queued', error = ?, updated = ?, due = ?, token = NULL"
        " WHERE id = ? AND token = ? AND status = 'running'",
        (dumps(error), now, now + delay_s, claimed.job.id, claimed.token),
    )
    return done.rowcount == 1


def sweep(db: sqlite3.Connection, now: float, most: int) -> int:
    return db.execute(
        "DELETE FROM jobs WHERE rowid IN (SELECT rowid FROM jobs WHERE expires <= ? LIMIT ?)",
        (now, most),
    ).rowcount


def depth(db: sqlite3.Connection, now: float) -> Depth:
    unfinished = "SELECT status, COUNT(*) FROM jobs WHERE status IN ('queued', 'running')"
    counts = dict(db.execute(f"{unfinished} GROUP BY status").fetchall())
    (oldest,) = db.execute("SELECT MIN(created) FROM jobs WHERE status = 'queued'").fetchone()
    waited = 0 if oldest is None else max(0.0, now - oldest)
    return Depth(counts.get("queued", 0), counts.get("running", 0), waited)


def _dropped(db: sqlite3.Connection, job_id: str) -> None:
    """A job that ended gives its upload back (DELETE ... RETURNING wrote 3x it, not 2x)."""
    row = db.execute("SELECT length(payload) FROM uploads WHERE id = ?", (job_id,)).fetchone()
    if row is not None:
        db.execute("DELETE FROM uploads WHERE id = ?", (job_id,))
        _held(db, -row[0])


def _held(db: sqlite3.Connection, change: int) -> None:
    if change:
        db.execute("UPDATE counts SET value = value + ? WHERE name = 'queued_bytes'", (change,))


def _ended(db: sqlite3.Connection, jobs: int) -> None:
    """`jobs` ended (negative: submitted)."""
    if jobs:
        db.execute("UPDATE counts SET value = value - ? WHERE name = 'unfinished'", (jobs,))
