"""More than one proxy process on one port (PROXY_WORKERS > 1), for machines with more cores
than one event loop can use.

`python -m proxy` becomes a supervisor: it starts the workers (each `python -m proxy` with
PROXY_WORKERS=1), each binding the port with SO_REUSEPORT so that the kernel spreads new
connections across them; it restarts a worker that dies and, on SIGTERM or SIGINT, passes
the signal on and waits for every worker's graceful stop. Workers share nothing but the
port: each has its own channels, streams and merged calls, and the limits (in flight, bytes)
are per worker. `/metrics` stays one view: the workers record into prometheus-client's
multiprocess directory (PROMETHEUS_MULTIPROC_DIR, made and removed by the supervisor) and
any worker's `/metrics` reads all of them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from proxy.settings import ProxySettings

log = logging.getLogger("proxy")

SUPERVISED = "PROXY_SUPERVISOR_PID"
"""Set in the workers' environment: they bind the shared port."""

RESTART_DELAY_S = 1.0
"""Pause before a dead worker is started again (a worker that cannot start does not spin)."""


def listening_socket(host: str, port: int, shared: bool) -> socket.socket:
    """The worker's listening socket; `shared`: SO_REUSEPORT, the kernel balancing new
    connections between the processes bound to the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def supervise(settings: ProxySettings) -> int:
    # Refused here, not in each worker: with SO_REUSEPORT a port another program holds
    # the same way would be shared silently.
    listening_socket(settings.host, settings.port, shared=False).close()
    if settings.grpc_port and settings.grpc_door_port is None:  # a front holds it
        listening_socket(settings.host, settings.grpc_port, shared=False).close()
    directory = tempfile.mkdtemp(prefix="proxy-metrics-")
    env = {
        **os.environ,
        # What the command line set reaches the workers as variables (they get no flags).
        **{
            f"PROXY_{name.upper()}": str(getattr(settings, name))
            for name in settings.model_fields_set
            if getattr(settings, name) is not None
        },
        "PROXY_WORKERS": "1",
        "PROMETHEUS_MULTIPROC_DIR": directory,
        SUPERVISED: str(os.getpid()),
    }
    stopping = False

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "proxy"], env=env)

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    workers = [start() for _ in range(settings.workers)]
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("proxy: %d workers on %s:%d", settings.workers, settings.host, settings.port)
    try:
        while not stopping:
            time.sleep(0.2)
            for i, worker in enumerate(workers):
                code = worker.poll()
                if code is None or stopping:
                    continue
                if code == 2:  # a start-up error (bad definitions): every worker has it
                    log.error("proxy worker %d cannot start (exit 2); stopping", worker.pid)
                    stop(signal.SIGTERM, None)
                    return 2
                log.error("proxy worker %d exited with %d; starting another", worker.pid, code)
                _forget(directory, worker.pid)
                time.sleep(RESTART_DELAY_S)
                workers[i] = start()
        codes = [worker.wait() for worker in workers]
        return 0 if all(code in (0, -signal.SIGTERM, -signal.SIGINT) for code in codes) else 1
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        shutil.rmtree(directory, ignore_errors=True)


def _forget(directory: str, pid: int) -> None:
    """A dead worker's gauges leave the sums (its counters and histograms stay counted)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, directory)
