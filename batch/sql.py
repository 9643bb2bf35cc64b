"""Database tables as a batch's source and sink, through SQLAlchemy Core (any URL it takes:
`postgresql+psycopg://user@host/db`, `sqlite:///path.db`, ...).

Source: a table (`--table`) or a query (`--query`), its key column (`--key`) and image column
(`--image`: the image's bytes, or a path to the file). Rows stream from a server-side cursor
(`yield_per`), so a table of millions is never held.

Sink: a table (`--output-table`, made if missing) with the key as its primary key, the status,
the latency, and the result and error as JSON. Rows are written by a thread of their own, the
ones waiting together in one transaction (a group commit): the event loop never waits for the
database, and a kill loses at most the rows of the transaction in flight, which the next run
sends again (the primary key keeps every input once)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from batch.sinks import Row, Sink, gave_up
from batch.sources import Input, Source, SourceError

YIELD_PER = 200


class Disconnected(SourceError):
    """The database stopped answering mid-run (a restart, a fail-over): the run can resume
    once it answers again (`mesh batch` does, re-reading what the output holds)."""


def _lost(exc: BaseException) -> bool:
    """An error of the connection, not of the statement."""
    return isinstance(exc, sa.exc.OperationalError) or (
        isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
    )


def _engine(url: str) -> sa.Engine:
    try:
        return sa.create_engine(url, pool_pre_ping=True)
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise SourceError(f"{url}: not a database URL SQLAlchemy can open ({exc})") from None


class TableSource(Source):
    def __init__(
        self, url: str, *, table: str | None, query: str | None, key: str, image: str
    ) -> None:
        if (table is None) == (query is None):
            raise SourceError("a database source needs --table or --query (one of them)")
        self.engine = _engine(url)
        self.key, self.image = key, image
        if table is not None:
            try:
                found = sa.Table(table, sa.MetaData(), autoload_with=self.engine)
            except sa.exc.NoSuchTableError:
                raise SourceError(f"{_shown(self.engine)}: no table '{table}'") from None
            except sa.exc.OperationalError as exc:
                raise _named(exc, self.engine) from None
            missing = [c for c in (key, image) if c not in found.c]
            if missing:
                raise SourceError(
                    f"table '{table}' has no column {missing} ({list(found.c.keys())})"
                )
            self.select: sa.Select = sa.select(found.c[key], found.c[image]).order_by(found.c[key])
        else:
            text = sa.text(query).columns(sa.column(key), sa.column(image))  # type: ignore[arg-type]
            self.select = sa.select(text.subquery())

    def skip_answered_in(self, sink: TableSink) -> None:
        """With the output table in the same database, read only the rows it does not hold
        yet (an anti-join), so a rerun of a mostly answered table does not send every image
        over the wire to skip it."""
        if sink.engine.url != self.engine.url:
            return
        source = self.select.subquery()
        key = source.c[self.key]
        answered = sa.select(sink.table.c.key).where(sink.table.c.key == sa.cast(key, sa.Text))
        self.select = sa.select(source).where(~answered.exists()).order_by(key)

    def count(self) -> int:
        try:
            with self.engine.connect() as conn:
                return conn.execute(
                    sa.select(sa.func.count()).select_from(self.select.subquery())
                ).scalar_one()
        except sa.exc.SQLAlchemyError as exc:
            raise _named(exc, self.engine) from None

    def __iter__(self) -> Iterator[Input]:
        try:
            with self.engine.connect().execution_options(
                stream_results=True, yield_per=YIELD_PER
            ) as conn:
                for key, value in conn.execute(self.select):
                    yield _input(str(key), value)
        except sa.exc.SQLAlchemyError as exc:
            raise _named(exc, self.engine) from None


def _named(exc: sa.exc.SQLAlchemyError, engine: sa.Engine) -> Exception:
    """Disconnected when the connection was lost, else SourceError; both name the database
    (without its password) and the driver's reason (without the SQL)."""
    kind = Disconnected if _lost(exc) else SourceError
    return kind(f"{_shown(engine)}: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    """The driver's own message (SQLAlchemy's adds the SQL and its parameters)."""
    return str(getattr(exc, "orig", None) or exc).strip()


def _shown(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _input(key: str, value: object) -> Input:
    if isinstance(value, bytes | bytearray | memoryview):
        return Input(key, data=bytes(value)) if value else Input(key, problem="empty image")
    if isinstance(value, str) and value:
        path = Path(value)
        return Input(key, path) if path.is_file() else Input(key, problem=f"no such file: {value}")
    return Input(key, problem=f"the image column holds {type(value).__name__}, not bytes or a path")


class TableSink(Sink):
    def __init__(self, url: str, table: str) -> None:
        self.engine = _engine(url)
        self.table = sa.Table(
            table,
            sa.MetaData(),
            sa.Column("key", sa.Text, primary_key=True),
            sa.Column("status", sa.Text, nullable=False),
            sa.Column("latency_ms", sa.Float),
            sa.Column("result", sa.JSON),
            sa.Column("error", sa.JSON),
        )
        try:
            self.table.create(self.engine, checkfirst=True)
        except sa.exc.OperationalError as exc:
            raise _named(exc, self.engine) from None
        self._rows: queue.Queue[Row | None] = queue.Queue()
        self._failure: BaseException | None = None
        self._writer = threading.Thread(target=self._write_all, name="batch-sql-sink", daemon=True)
        self._writer.start()

    def answered(self) -> set[str]:
        with self.engine.connect().execution_options(stream_results=True, yield_per=5000) as conn:
            return {key for (key,) in conn.execute(sa.select(self.table.c.key))}

    def forget_given_up(self) -> int:
        """The rows an earlier run gave up on, deleted in one transaction."""
        table = self.table
        failed = sa.select(table.c.key, table.c.error).where(table.c.status == "failed")
        try:
            with self.engine.begin() as conn:
                keys = [k for k, error in conn.execute(failed) if gave_up("failed", error)]
                for start in range(0, len(keys), 500):
                    conn.execute(table.delete().where(table.c.key.in_(keys[start : start + 500])))
        except sa.exc.OperationalError as exc:
            raise _named(exc, self.engine) from None
        return len(keys)

    def write(self, row: Row) -> None:
        self._raise_failure()
        self._rows.put(row)

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:
            kind = Disconnected if _lost(failure) else RuntimeError
            raise kind(f"the output table cannot be written: {_reason(failure)}")

    def _write_all(self) -> None:
        insert = self.table.insert()
        while True:
            first = self._rows.get()
            group = [first]
            while not self._rows.empty():
                group.append(self._rows.get_nowait())
            done = None in group
            rows = [r for r in group if r is not None]
            if rows:
                try:
                    with self.engine.begin() as conn:
                        conn.execute(insert, [_values(r) for r in rows])
                except sa.exc.SQLAlchemyError as exc:
                    self._failure = exc
                    return
            if done:
                return

    def close(self) -> None:
        self._rows.put(None)
        self._writer.join()
        self.engine.dispose()
        self._raise_failure()


def _values(row: Row) -> dict[str, object]:
    return {
        "key": row.key,
        "status": row.status,
        "latency_ms": row.latency_ms,
        "result": row.result,
        "error": row.error,
    }
