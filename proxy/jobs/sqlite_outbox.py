"""The callbacks' outbox in the jobs' SQLite table: `callback_due` (NULL: nothing to send),
set by a final state's write (sqlite_sql.OUTBOX), read and moved here (outbox.py)."""

from __future__ import annotations

import sqlite3


def callback_done(
    db: sqlite3.Connection, job_id: str, outcome: str, retry_at: float | None
) -> None:
    db.execute(
        "UPDATE jobs SET callback_status = ?, callback_due = ? WHERE id = ?",
        (outcome, retry_at, job_id),
    )


def due_callbacks(db: sqlite3.Connection, now: float, until: float, most: int) -> list[str]:
    """The ids of callbacks due at `now`, each held `until` then (the caller tries them)."""
    rows = db.execute(
        "SELECT id FROM jobs WHERE callback_due <= ? ORDER BY callback_due LIMIT ?", (now, most)
    ).fetchall()
    db.executemany("UPDATE jobs SET callback_due = ? WHERE id = ?", [(until, r[0]) for r in rows])
    return [r[0] for r in rows]
