"""A real PostgreSQL (Debian's `postgresql`) as a local process on 127.0.0.1, for the tests and
the benchmarks: a fresh cluster in a temporary folder (initdb), trust authentication for
local connections, a free port, stopped and removed with the folder.

PostgreSQL refuses to run as root: as root (CI), the cluster is made and run as the
`postgres` user the Debian package creates, in a folder that user owns."""

from __future__ import annotations

import functools
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.mesh import free_port
from compose.processes import stop_process


class Unavailable(RuntimeError):
    """No PostgreSQL here (`./mesh test` installs Debian's when run as root)."""


@functools.cache
def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


def _program(name: str) -> str:
    """A PostgreSQL program's path (start() has checked that PostgreSQL is there)."""
    bin_dir = _bin_dir()
    assert bin_dir is not None
    return str(bin_dir / name)


def available() -> bool:
    return _bin_dir() is not None


@dataclass
class PostgresServer:
    process: subprocess.Popen
    port: int
    folder: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        stop_process(self.process)  # SIGTERM, smart shutdown: connections end, then it stops
        shutil.rmtree(self.folder, ignore_errors=True)

    def restart(self, down_s: float = 0.0) -> None:
        """A fast shutdown (`pg_ctl stop -m fast`: its sessions are ended, as a restart or a
        fail-over ends them), `down_s` without a server, then the same cluster on the same port."""
        subprocess.run(
            [*_as_user(), _program("pg_ctl"), "stop", "-D", str(self.folder / "data"),
             "-m", "fast", "-w"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.process.wait(30)
        time.sleep(down_s)
        self.process = _launch(self.folder, self.port)
        _wait_ready(self)


def start() -> PostgresServer:
    if _bin_dir() is None:
        raise Unavailable("PostgreSQL is missing (apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="mesh-postgres-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    subprocess.run(
        [*_as_user(), _program("initdb"), "-D", str(folder / "data"), "-U", "postgres",
         "--auth=trust", "--encoding=UTF8", "--no-sync"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    server = PostgresServer(_launch(folder, port), port, folder)
    try:
        _wait_ready(server)
    except RuntimeError:
        server.stop()
        raise
    return server


def _as_user() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _launch(folder: Path, port: int) -> subprocess.Popen:
    log = (folder / "postgres.log").open("ab")
    process = subprocess.Popen(
        [*_as_user(), _program("postgres"), "-D", str(folder / "data"), "-p", str(port),
         "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={folder}",
         "-c", "fsync=off"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()  # the server holds its own copy
    return process


def _wait_ready(server: PostgresServer) -> None:
    deadline = time.monotonic() + 30
    while True:
        ready = subprocess.run(
            [_program("pg_isready"), "-h", "127.0.0.1", "-p", str(server.port)],
            capture_output=True,
        )
        if ready.returncode == 0:
            return
        if server.process.poll() is not None or time.monotonic() > deadline:
            text = (server.folder / "postgres.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"postgres did not start:\n{text}")
        time.sleep(0.1)
