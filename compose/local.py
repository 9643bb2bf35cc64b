"""`python -m compose.local`: run the compose topology as local processes.

Starts every service of compose/compose.yaml on 127.0.0.1 in dependency
order, waits for each one's healthcheck, streams prefixed logs, and stops
everything on Ctrl-C or SIGTERM (SIGTERM, then SIGKILL after a grace period), in
reverse dependency order as `docker compose down` does.
A service whose program is not installed (Debian's redis-server) is left out, and
the settings naming it keep their defaults (the jobs' queue then in SQLite).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from compose.topology import LocalService, TopologyError, load, start_order, unavailable

COMPOSE_DIR = Path(__file__).resolve().parent
ROOT = COMPOSE_DIR.parent
DEFAULT_FILE = COMPOSE_DIR / "compose.yaml"


class LocalMesh:
    """The running processes of one topology."""

    def __init__(self, services: dict[str, LocalService], *, out=sys.stdout) -> None:
        self.services = services
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._out = out
        self._lock = threading.Lock()
        self._width = max(len(n) for n in services)

    def _pump(self, name: str, stream) -> None:
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                with self._lock:
                    print(f"{name:<{self._width}} | {line}", file=self._out, flush=True)

    def start(self, name: str) -> None:
        svc = self.services[name]
        for folder in svc.folders:
            folder.mkdir(parents=True, exist_ok=True)
        # Each process's spans under its own service name (protos/tracing.py), unless the
        # compose file names it.
        proc = subprocess.Popen(
            svc.argv,
            cwd=ROOT,
            env={**os.environ, "OTEL_SERVICE_NAME": name, **svc.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        threading.Thread(target=self._pump, args=(name, proc.stdout), daemon=True).start()

    def wait_healthy(self, name: str, timeout: float) -> None:
        svc = self.services[name]
        end = time.monotonic() + timeout
        while True:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"service '{name}' exited with {proc.returncode}")
            if svc.healthcheck is None:
                return
            check = subprocess.run(
                svc.healthcheck,
                cwd=ROOT,
                capture_output=True,
                env={**os.environ, **svc.env},
                timeout=30,
            )
            if check.returncode == 0:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"service '{name}' not healthy after {timeout:.0f}s")
            time.sleep(0.2)

    def up(self, timeout: float = 180.0) -> None:
        """Start in waves: every service whose dependencies are healthy starts at once."""
        pending = start_order(self.services)
        healthy: set[str] = set()
        while pending:
            wave = [n for n in pending if set(self.services[n].depends_on) <= healthy]
            for name in wave:
                self.start(name)
            for name in wave:
                self.wait_healthy(name, timeout)
            healthy.update(wave)
            pending = [n for n in pending if n not in healthy]

    def supervise(self) -> bool:
        """Restart exited services as their restart policy says; False when one may not."""
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            policy = self.services[name].restart
            if policy in ("always", "unless-stopped") or (policy == "on-failure" and code != 0):
                print(
                    f"compose.local: {name} exited with {code}; restarting ({policy})",
                    file=sys.stderr,
                    flush=True,
                )
                self.start(name)
            else:
                print(f"compose.local: {name} exited with {code}; stopping", file=sys.stderr)
                return False
        return True

    def down(self, grace: float = 15.0) -> None:
        """Stop in waves, as `docker compose down` does: a service once nothing still running
        depends on it. The proxy drains its requests in flight (and writes its jobs' outcomes)
        while the services and the queue it needs still answer; signalled all at once, its
        last requests met services already draining, and its job workers a Redis gone."""
        left = [name for name in self.procs if self.procs[name].poll() is None]
        while left:
            needed = {d for name in left for d in self.services[name].depends_on}
            wave = [name for name in left if name not in needed] or left
            for name in wave:
                self.procs[name].send_signal(signal.SIGTERM)
            end = time.monotonic() + grace
            for name in wave:
                try:
                    self.procs[name].wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.procs[name].kill()
                    self.procs[name].wait()
            left = [name for name in left if name not in wave]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "-f",
        "--file",
        type=Path,
        action="append",
        help="compose file(s); later ones override (default compose/compose.yaml)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds each service may take to become healthy",
    )
    parser.add_argument(
        "--port-offset",
        type=int,
        default=0,
        help="add this to every port (to run a second mesh beside another)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=ROOT / "data",
        help="folder of the named volumes (default data/)",
    )
    args = parser.parse_args(argv)
    files = args.file or [DEFAULT_FILE]
    try:
        missing = unavailable(files)
        for name, program in missing.items():
            print(
                f"compose.local: {program} is not installed: '{name}' left out, and the "
                "settings naming it keep their defaults",
                file=sys.stderr,
            )
        services = load(
            files, port_offset=args.port_offset, data_dir=args.data, leave_out=set(missing)
        )
    except (TopologyError, OSError) as exc:
        print(f"compose.local: {exc}", file=sys.stderr)
        return 2
    taken = busy_ports(services)
    for name, port in taken:
        print(f"compose.local: port {port} ({name}) is in use on 127.0.0.1", file=sys.stderr)
    if taken:
        print(
            "compose.local: stop what holds it (an earlier `./mesh up`?), or run this mesh "
            "beside it: ./mesh up --port-offset 1000",
            file=sys.stderr,
        )
        return 2
    mesh = LocalMesh(services)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        mesh.up(args.timeout)
        print(ready_banner(services), flush=True)
        while not stop.is_set():
            if not mesh.supervise():
                return 1
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        print(f"compose.local: {exc}", file=sys.stderr)
        return 1
    finally:
        mesh.down()
    return 0


def _argument_port(svc: LocalService) -> str:
    """A `--port` argument's value (redis-server takes no environment), or ''."""
    return svc.argv[svc.argv.index("--port") + 1] if "--port" in svc.argv[:-1] else ""


def _ports(svc: LocalService) -> list[int]:
    """Every port a service listens on: its `*_PORT` settings and its `--port` argument."""
    values = [v for k, v in svc.env.items() if k.endswith("_PORT")] + [_argument_port(svc)]
    return [int(v) for v in values if v.isdigit()]


def busy_ports(services: dict[str, LocalService]) -> list[tuple[str, int]]:
    """The ports something else already listens on. Checked before anything starts: else
    the one service that cannot bind exits, the mesh stops, and the reason is one log line
    among the others' start and stop (a second `./mesh up` beside a first)."""
    busy = []
    for name, svc in services.items():
        for port in _ports(svc):
            with socket.socket() as probe:
                # As the servers bind: a port left in TIME_WAIT by a mesh just stopped is free.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    busy.append((name, port))
    return busy


def _port(svc: LocalService) -> str:
    """The port a service serves on: its `*_PORT` setting (not its metrics'), else its
    `--port` argument."""
    port = next((v for k, v in svc.env.items() if k.endswith("_PORT") and "METRICS" not in k), "")
    return port or _argument_port(svc) or "?"


def ready_banner(services: dict[str, LocalService]) -> str:
    lines = ["", "mesh is up:"]
    for name, svc in services.items():
        lines.append(f"  {name:<16} 127.0.0.1:{_port(svc)}")
    if "proxy" in services:
        url = f"http://127.0.0.1:{_port(services['proxy'])}"
        lines += [
            "",
            f"proxy: {url}   (OpenAPI: {url}/docs, readiness: {url}/readyz)",
            "try:",
            f"  curl -s -X POST -H 'Content-Type: image/jpeg' --data-binary "
            f"@docs/examples/digit.jpg {url}/v1/pipelines/digits/infer",
            f"  curl -s -X POST -F file=@docs/examples/page.jpg {url}/v1/pipelines/ocr/infer",
        ]
    lines.append("Ctrl-C stops every service.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
