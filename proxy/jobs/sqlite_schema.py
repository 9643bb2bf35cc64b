"""The jobs' SQLite tables (sqlite_queue.py creates them; sqlite_sql.py reads and writes
them)."""

import sqlite3

ADDED = {"callback_due": "REAL", "traceparent": "TEXT"}
"""Columns added since the table's first release: a database made before gets them."""


def create(db: sqlite3.Connection) -> None:
    """The tables and indexes, a database of an older release brought up to date."""
    db.executescript(TABLE)
    have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    for name, kind in ADDED.items():
        if name not in have:
            try:
                db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as exc:  # another process added it meanwhile
                if "duplicate column" not in str(exc):
                    raise
    _move_uploads(db)
    db.executescript(SCHEMA)


def _move_uploads(db: sqlite3.Connection) -> None:
    """Uploads of a database of an earlier release (in `jobs.payload`) moved to `uploads`,
    once (`user_version` 1 says it is done)."""
    if db.execute("PRAGMA user_version").fetchone()[0] >= 1:
        return
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT OR IGNORE INTO uploads SELECT id, payload FROM jobs WHERE payload NOT NULL")
    db.execute("UPDATE jobs SET payload = NULL WHERE payload NOT NULL")
    db.execute("PRAGMA user_version = 1")
    db.execute("COMMIT")


TABLE = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, pipeline TEXT NOT NULL, status TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL,
    due REAL NOT NULL,  -- queued: when it may run; running: when its lease runs out
    token TEXT, attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL,
    budget_ms REAL NOT NULL, kind TEXT NOT NULL,
    payload BLOB,  -- an upload of an earlier release's job (now in `uploads`)
    result BLOB, error BLOB, callback TEXT, callback_status TEXT,
    idem TEXT UNIQUE, digest TEXT, finished REAL, expires REAL,
    callback_due REAL,  -- the callback's next try (NULL: none pending), outbox.py
    traceparent TEXT  -- the submitting request's span, when traces are on
);
-- An unfinished job's upload, beside its row: in the row (`payload`, earlier releases) every
-- claim rewrote it (a row whose size changes is written anew, its blob with it), and a job's
-- life wrote 8x its upload; now 4x (in, and out as zeros: SQLite's secure_delete).
CREATE TABLE IF NOT EXISTS uploads (id TEXT PRIMARY KEY, payload BLOB NOT NULL) WITHOUT ROWID;
"""

SCHEMA = """CREATE INDEX IF NOT EXISTS jobs_due ON jobs (status, due);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created, id);
-- A page of one status or one pipeline read in order (without them, every job of the status
-- was sorted for each page).
CREATE INDEX IF NOT EXISTS jobs_status_created ON jobs (status, created, id);
CREATE INDEX IF NOT EXISTS jobs_pipeline_created ON jobs (pipeline, created, id);
CREATE INDEX IF NOT EXISTS jobs_expires ON jobs (expires) WHERE expires IS NOT NULL;
-- The outbox: callbacks waiting for a try, in due order.
CREATE INDEX IF NOT EXISTS jobs_callback_due ON jobs (callback_due)
    WHERE callback_due IS NOT NULL;
-- Unfinished jobs, kept beside them in the same transactions: the bound's check is then one
-- row, not a count over a backlog (that count grew with it: 1 ms at 7,500 queued).
CREATE TABLE IF NOT EXISTS counts (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counts
    SELECT 'unfinished', COUNT(*) FROM jobs WHERE status IN ('queued', 'running');
-- Their uploads' bytes, kept the same way (an upload is dropped when its job ends).
INSERT OR IGNORE INTO counts SELECT 'queued_bytes', COALESCE(SUM(length(payload)), 0) FROM uploads;
"""
