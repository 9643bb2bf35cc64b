"""An HTTP server on 127.0.0.1 taking jobs' callbacks, on a thread of its own (so that it
answers whatever the test's own loop is doing)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Hook:
    url: str
    bodies: list[dict] = field(default_factory=list)
    """Every callback's body, in arrival order, those refused included."""
    sent: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    """Every callback's headers (lower-cased names) and raw body, in the same order."""
    taken: Counter = field(default_factory=Counter)
    """How many callbacks each (job id, status) got answered 204."""
    at_once: int = 0
    most_at_once: int = 0
    """Callbacks being answered at the same time, and the most there were."""

    @property
    def host(self) -> str:
        """As PROXY_JOBS_CALLBACK_HOSTS names it."""
        return self.url.split("/")[2]


@contextmanager
def callbacks_received(
    failures: int = 0, refusing: threading.Event | None = None, delay_s: float = 0.0
) -> Iterator[Hook]:
    """The receiver: 500 to the first `failures` callbacks, and 503 while `refusing` is set;
    204 otherwise; each answered after `delay_s`."""
    lock = threading.Lock()
    hook: Hook

    class Taking(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            body = json.loads(raw)
            with lock:
                hook.sent.append(({k.lower(): v for k, v in self.headers.items()}, raw))
                hook.at_once += 1
                hook.most_at_once = max(hook.most_at_once, hook.at_once)
            time.sleep(delay_s)
            with lock:
                hook.at_once -= 1
                hook.bodies.append(body)
                status = 500 if len(hook.bodies) <= failures else 204
                if refusing is not None and refusing.is_set():
                    status = 503
                if status == 204:
                    hook.taken[body["id"], body["status"]] += 1
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Taking)
    hook = Hook(f"http://127.0.0.1:{server.server_address[1]}/done")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
