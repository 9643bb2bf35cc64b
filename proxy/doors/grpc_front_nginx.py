"""nginx as the gRPC door's front: its configuration from the proxy's settings, and its
process, a child of the proxy (or of the workers' supervisor) that dies with it.

Why nginx: the door's unary calls cost grpc.aio ~0.4 ms of the proxy's CPU each and kept
two thirds of a request's time outside the pipeline at concurrency 32, so merged calls carried
2-3 rows where REST's carried 13 (bench/README, issue 30). nginx terminates HTTP/2 in C,
and the REST server answers the call as it answers /v1 (proxy/doors/grpc_front.py).
It is Debian's `nginx` (ingress-nginx's engine), installed by `./mesh test` where it can be
and in the proxy's image; `auto` falls back to the grpc.aio door alone where it is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from string import Template

from protos.ports import free_port
from proxy.doors.grpc_front import FRONT_HEADER, PATH, STATUS_ONLY
from proxy.settings import ProxySettings

log = logging.getLogger("proxy")

STREAM_IDLE_S = 3600
"""Longest a gRPC stream through the front may go without a message either way (nginx's
read, send and body timeouts on the door's location); the door's own idle limit is shorter."""
START_TIMEOUT_S = 10.0

CONFIG = Template("""\
$user
worker_processes 1;
worker_rlimit_nofile $files;
pid $folder/nginx.pid;
events { worker_connections $connections; }
http {
  access_log off;
  server_tokens off;
  client_body_temp_path $folder/body;
  proxy_temp_path $folder/proxy;
  fastcgi_temp_path $folder/fastcgi;
  uwsgi_temp_path $folder/uwsgi;
  scgi_temp_path $folder/scgi;
  upstream rest {
    server $rest;
    keepalive 64;
    keepalive_requests 100000000;
  }
  upstream door {
    server $door;
    keepalive 16;
  }
  server {
    listen $listen http2;
    http2_max_concurrent_streams $streams;
    keepalive_timeout ${idle}s;
    keepalive_requests 1000000000;  # a gRPC channel's calls (nginx's default: 1,000 each)
    client_header_timeout ${head}s;
    client_body_timeout ${head}s;
    large_client_header_buffers 4 ${head_kb}k;
    client_max_body_size ${body_kb}k;
    # nginx's own refusals as gRPC statuses (a gRPC client reads an HTTP 413 as UNKNOWN).
    error_page 413 = @too_large;
    error_page 502 503 504 = @unavailable;
    error_page 408 = @too_slow;
    error_page $status_only = @status_only;
    # Every error a status alone (Trailers-Only: one HEADERS frame that ends the stream,
    # :status 200, content-type application/grpc): one whose headers came first is committed,
    # never retried by a client's retry policy; and a 204 is no gRPC answer (nginx drops its
    # content-type), whatever clients make of it.
    location @status_only {
      default_type application/grpc;
      add_header grpc-status $$upstream_http_grpc_status always;
      add_header grpc-message $$upstream_http_grpc_message always;
      add_header http-status $$upstream_http_http_status always;
      add_header grpc-retry-pushback-ms $$upstream_http_grpc_retry_pushback_ms always;
      return 200;
    }
    location @too_large {
      default_type application/grpc;
      add_header grpc-status 8 always;
      add_header grpc-message "message larger than the door accepts (PROXY_MAX_BODY_MB)" always;
      return 200;
    }
    location @unavailable {
      default_type application/grpc;
      add_header grpc-status 14 always;
      add_header grpc-message "the proxy is not answering (starting or stopping)" always;
      return 200;
    }
    location @too_slow {
      default_type application/grpc;
      add_header grpc-status 4 always;
      add_header grpc-message "the call's message was not received in time" always;
      return 200;
    }
    location = $path {
      proxy_pass http://rest;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header $front_header 1;
      proxy_request_buffering off;
      proxy_intercept_errors on;  # the route's errors ($status_only): @status_only
      proxy_read_timeout ${budget}s;
      proxy_send_timeout ${budget}s;
      add_trailer grpc-status 0;
    }
    location / {
      grpc_pass grpc://door;
      grpc_read_timeout ${stream_idle}s;
      grpc_send_timeout ${stream_idle}s;
      client_body_timeout ${stream_idle}s;
    }
  }
}
""")


class FrontError(RuntimeError):
    """nginx asked for and missing, or it would not start."""


def wanted(settings: ProxySettings) -> bool:
    """Whether the door gets the front: `nginx` requires it, `auto` takes it when nginx is
    installed; no door, no front."""
    if settings.grpc_port is None or settings.grpc_front == "off":
        return False
    if binary(settings):
        return True
    if settings.grpc_front == "nginx":
        raise FrontError(f"PROXY_GRPC_FRONT=nginx but '{settings.grpc_front_nginx}' is not found")
    log.info(
        "no nginx: the gRPC door answers unary calls itself (PROXY_GRPC_FRONT, "
        "docs/calling.md: with nginx they ran 1.2-1.5x faster at concurrency 32)"
    )
    return False


def binary(settings: ProxySettings) -> str | None:
    """The nginx to run: on PATH, or where Debian puts it (/usr/sbin is on root's PATH only)."""
    name = settings.grpc_front_nginx
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _loopback(host: str) -> str:
    """Where this machine reaches a server bound to `host`."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def config(settings: ProxySettings, folder: Path) -> str:
    """nginx.conf for a front on settings.grpc_port, the door behind it on 127.0.0.1 at
    settings.grpc_door_port."""
    assert settings.grpc_port is not None and settings.grpc_door_port is not None
    host, port = settings.host, settings.grpc_port
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    body_kb = int(settings.door_message_mb() * 1024) + 1
    # PROXY_GRPC_MAX_CONNECTIONS bounds nginx's connections, the clients' and its own to the
    # proxy: descriptors stay bounded under a flood of idle connections (beyond it nginx
    # closes the oldest idle ones for the new), and calls in flight then wait for it.
    connections = settings.grpc_max_connections
    return CONFIG.substitute(
        user=f"user {getpass.getuser()};" if os.geteuid() == 0 else "",
        files=min(connections * 2 + 64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
        folder=folder,
        connections=connections,
        rest=f"{_loopback(settings.host)}:{settings.port}",
        door=f"127.0.0.1:{settings.grpc_door_port}",
        listen=listen,
        streams=1024,
        idle=int(settings.grpc_idle_s),
        head=int(settings.head_timeout_s),
        head_kb=int(settings.max_head_kb),
        body_kb=body_kb,
        path=PATH,
        front_header=FRONT_HEADER.decode(),
        status_only=STATUS_ONLY,
        budget=int(settings.max_timeout_ms / 1000) + 30,
        stream_idle=STREAM_IDLE_S,
    )


def _die_with_parent() -> None:
    """In the child: SIGTERM when the proxy dies, however it dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    os.setsid()  # not in the proxy's process group: a Ctrl-C reaches it through the proxy


@contextlib.contextmanager
def running(settings: ProxySettings) -> Iterator[ProxySettings]:
    """The proxy's settings for a run behind nginx (the door moved to a port of its own on
    127.0.0.1), with nginx running on the door's port until the block ends; the settings
    unchanged when no front is wanted. nginx dying on its own stops the proxy (SIGTERM), so
    that its supervisor restarts both."""
    if not wanted(settings):
        yield settings
        return
    door_port = settings.grpc_door_port or free_port()
    settings = settings.model_copy(update={"grpc_door_port": door_port})
    # One folder per door port (no two proxies share one): a proxy that died without its
    # `finally` (uvicorn ends by raising the SIGTERM it caught) leaves it to the next.
    folder = Path(tempfile.gettempdir()) / f"proxy-front-{settings.grpc_port}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    (folder / "nginx.conf").write_text(config(settings, folder))
    command = [str(binary(settings)), "-e", "stderr", "-p", str(folder)]
    command += ["-c", str(folder / "nginx.conf"), "-g", "daemon off;"]
    process = subprocess.Popen(command, preexec_fn=_die_with_parent)
    stopping = threading.Event()
    try:
        _wait_listening(process, settings)
        log.info(
            "gRPC door on %s:%d behind nginx (unary ModelInfer to the REST server, the rest "
            "to the door on 127.0.0.1:%d)",
            settings.host, settings.grpc_port, settings.grpc_door_port,
        )  # fmt: skip
        threading.Thread(target=_watch, args=(process, stopping), daemon=True).start()
        yield settings
    finally:
        stopping.set()
        _stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_listening(process: subprocess.Popen, settings: ProxySettings) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    address = (_loopback(settings.host).strip("[]"), settings.grpc_port)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise FrontError(f"nginx exited with {process.returncode} (its errors above)")
        with contextlib.suppress(OSError), socket.create_connection(address, timeout=0.2):
            return
        time.sleep(0.02)
    raise FrontError(f"nginx did not listen on port {settings.grpc_port} within {START_TIMEOUT_S}s")


def _watch(process: subprocess.Popen, stopping: threading.Event) -> None:
    code = process.wait()
    if not stopping.is_set():
        log.error("nginx (the gRPC door's front) exited with %s; stopping the proxy", code)
        os.kill(os.getpid(), signal.SIGTERM)


def _stop(process: subprocess.Popen) -> None:
    """Graceful (SIGQUIT: calls in flight finish), then forced."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGQUIT)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def front_pids(parent: int) -> list[int]:
    """The nginx processes (master and workers) the proxy `parent` started (benchmarks and
    tests count their CPU with the proxy's)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
            if fields.get("Name", "").strip() == "nginx":
                found.append((int(status.parent.name), int(fields["PPid"])))
    masters = {pid for pid, ppid in found if ppid == parent}
    return sorted(masters | {pid for pid, ppid in found if ppid in masters})
