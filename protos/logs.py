"""Structured (JSON lines) logs carrying the request id of the current call."""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import os
import re
import sys
import time

from protos import tracing

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

_PLAIN_ID = re.compile(r"[A-Za-z0-9._:+/%\-]{1,128}")
"""URL-safe characters, '/' and '%' included: a batch names each request by its file's path,
percent-encoded (`batch-scans/2026/a%20b.png`)."""


def plain_id(given: str | bytes) -> str:
    """The caller's request id if it is short and plain, else a new one: ids travel in gRPC
    metadata and every log line (a 20 MiB id once grew a log by 120 MiB)."""
    text = given.decode(errors="replace") if isinstance(given, bytes) else given
    return text if _PLAIN_ID.fullmatch(text) else new_id()


def new_id() -> str:
    """A request id unique across processes and restarts (32 hex digits, as uuid4's): a
    random prefix drawn per process, then a counter. A uuid4 per request cost ~3.8 us (a
    getrandom call each), this ~0.4 us; request ids must be unique, not secret (job ids,
    which are handles to results, stay uuid4)."""
    return f"{_id_prefix}{next(_id_count):016x}"


def _draw_prefix() -> None:
    global _id_prefix, _id_count
    _id_prefix = os.urandom(8).hex()
    _id_count = itertools.count()


_id_prefix = ""
_id_count = itertools.count()
_draw_prefix()
os.register_at_fork(after_in_child=_draw_prefix)  # a forked worker must not repeat its parent


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id:
            entry["request_id"] = request_id
        if tracing.ENABLED and (ids := tracing.ids()) is not None:
            entry["trace_id"], entry["span_id"] = ids
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "INFO") -> None:
    """JSON logs to stderr for the whole process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
