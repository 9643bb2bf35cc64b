"""A real PostgreSQL (Debian's `postgresql`) as a local process on 127.0.0.1, for the tests and
the benchmarks: a fresh cluster in a temporary folder (initdb), trust authentication for
local connections, a free port, stopped and removed with the folder.

PostgreSQL refuses to run as root: as root (CI), the cluster is made and run as the
`postgres` user the Debian package creates, in a folder that user owns."""

from __future__ import annotations

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


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


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


def start() -> PostgresServer:
    bin_dir = _bin_dir()
    if bin_dir is None:
        raise Unavailable("PostgreSQL is missing (apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="mesh-postgres-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = folder / "data"
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
         "--auth=trust", "--encoding=UTF8", "--no-sync"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    log = (folder / "postgres.log").open("wb")
    process = subprocess.Popen(
        [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
         "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={folder}",
         "-c", "fsync=off"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()  # the server holds its own copy
    server = PostgresServer(process, port, folder)
    deadline = time.monotonic() + 30
    while True:
        ready = subprocess.run(
            [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
            capture_output=True,
        )
        if ready.returncode == 0:
            return server
        if process.poll() is not None or time.monotonic() > deadline:
            text = (folder / "postgres.log").read_text(errors="replace")[-2000:]
            server.stop()
            raise RuntimeError(f"postgres did not start:\n{text}")
        time.sleep(0.1)
