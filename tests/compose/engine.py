"""A private Docker engine for the compose smoke test, on a machine that reaches no registry.

What it takes (see issue #6 and the README's "Docker" section):
- Debian's docker.io, docker-compose (1.29) and mmdebstrap, installed with apt-get when
  missing (root only);
- dockerd started by us with no default bridge and no iptables rules, its exec root in a
  temporary folder, listening on a socket there, its data root under build/compose/ so
  that the images it built stay for the next run (nothing else on the machine is touched);
- a base image made with mmdebstrap (bookworm, minbase, python3 + venv, and Debian's
  redis-server, so that the same image serves as compose's REDIS_IMAGE) and `docker
  import`, cached under build/compose/ so that a rerun skips the ~30 s it takes;
- the wheelhouse of compose.wheelhouse, so the image build installs with `--no-index`
  in seconds;
- the mesh's image, built by `./mesh test`'s set-up (`provision`) as the servers the tests
  start are installed there; the test builds it again, from Docker's layer cache when
  nothing changed since.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from compose.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
CACHE = ROOT / "build" / "compose"
DATA_ROOT = CACHE / "docker"
BASE_IMAGE = "mesh-base:bookworm"
REDIS = {"REDIS_IMAGE": BASE_IMAGE}
"""No registry here: the base image has Debian's redis-server."""
HOST_FILES = ("compose.yaml", "compose.host.yaml")
_ROOTFS_LABEL = "mesh.rootfs"
DEBIAN_MIRROR = os.environ.get("MESH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = {
    "dockerd": "docker.io",
    "docker-compose": "docker-compose",
    "mmdebstrap": "mmdebstrap",
}
# Variables of ours that must not leak from the caller's shell into the containers.
_OUR_PREFIXES = ("PREDICTOR_", "PREPROCESS_", "PROXY_", "DOCKER_", "COMPOSE_")


class EngineError(RuntimeError):
    """The Docker engine could not be provided; the message says which step failed."""


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise EngineError(
            f"{' '.join(argv[:4])} ... exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return done


def missing_packages() -> list[str]:
    """The Debian packages of PACKAGES whose tool is not installed (`./mesh test` installs
    them with the other servers': `python -m tests.compose.engine --missing`)."""
    return [pkg for tool, pkg in PACKAGES.items() if shutil.which(tool) is None]


def install_tools() -> None:
    missing = missing_packages()
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineError(f"need {', '.join(missing)} (Debian packages) and root to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], env=env)
    _run(["apt-get", "install", "-y", "-qq", *missing], env=env)


def docker_cli() -> str:
    # The engine package's own client matches its API version; any client negotiates.
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise EngineError("no docker client found")


@dataclass
class Engine:
    root: Path
    process: subprocess.Popen[bytes]

    @property
    def host(self) -> str:
        return f"unix://{self.root / 'docker.sock'}"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for docker and docker-compose: our socket, none of the caller's
        mesh variables, plus `extra` (e.g. a swapped predictor address)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(_OUR_PREFIXES)}
        return {**base, "DOCKER_HOST": self.host, **(extra or {})}

    def docker(self, *args: str) -> str:
        return _run([docker_cli(), *args], env=self.env()).stdout

    def log_tail(self, lines: int = 40) -> str:
        text = (self.root / "dockerd.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def _wait_ready(engine: Engine, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise EngineError(f"dockerd exited {engine.process.returncode}:\n{engine.log_tail()}")
        probe = subprocess.run(
            [docker_cli(), "version", "--format", "{{.Server.Version}}"],
            env=engine.env(),
            capture_output=True,
        )
        if probe.returncode == 0:
            return
        time.sleep(0.5)
    raise EngineError(f"dockerd not answering after {timeout_s:.0f} s:\n{engine.log_tail()}")


def _stop(engine: Engine) -> None:
    stop_process(engine.process, timeout=60)
    # Anything dockerd left mounted under its roots would make the folder undeletable.
    mounts = [m.split()[1] for m in Path("/proc/mounts").read_text().splitlines()]
    roots = (str(engine.root), str(DATA_ROOT))
    ours = sorted((m for m in mounts if m.startswith(roots)), reverse=True)
    for mountpoint in ours:
        subprocess.run(["umount", "-l", mountpoint], capture_output=True)
    shutil.rmtree(engine.root, ignore_errors=True)


@contextmanager
def engine() -> Iterator[Engine]:
    """A running private dockerd; stopped and its folder removed on exit."""
    install_tools()
    # A short path: the socket's must fit in sun_path (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="mesh-docker-"))
    log = (root / "dockerd.log").open("wb")
    process = subprocess.Popen(
        [
            "dockerd",
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            f"--data-root={DATA_ROOT}",
            f"--exec-root={root / 'exec'}",
            f"--pidfile={root / 'dockerd.pid'}",
            f"--host=unix://{root / 'docker.sock'}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    running = Engine(root, process)
    try:
        _wait_ready(running)
        # Containers a killed run left in the kept data root restart with the engine
        # (`restart: unless-stopped`) and would hold the mesh's ports.
        if left := running.docker("ps", "-aq").split():
            running.docker("rm", "-f", *left)
        yield running
    finally:
        _stop(running)
        log.close()


def base_rootfs() -> Path:
    """Debian bookworm minbase with python3, venv, redis-server and nginx, as a tarball cached
    under build/compose/. mmdebstrap (installed by `install_tools`, as `engine` starts)
    writes it with apt's parallel downloads: ~30 s on a fresh machine, where debootstrap
    took ~100 s."""
    tarball = CACHE / "bookworm-minbase-redis-nginx.tar"
    if not tarball.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial")
        _run(
            [
                "mmdebstrap", "--quiet", "--format=tar", "--variant=minbase",
                "--include=python3,python3-venv,redis-server,nginx", "bookworm",
                str(partial), DEBIAN_MIRROR,
            ]
        )  # fmt: skip
        partial.rename(tarball)
    return tarball


def base_image(engine: Engine) -> str:
    """`BASE_IMAGE` for the Dockerfile, and `REDIS_IMAGE` for compose (`base_rootfs`),
    imported again only when the root filesystem's tarball changed: a new import is a new
    image, and every layer built on the old one would be built again."""
    tarball = base_rootfs()
    stat = tarball.stat()
    stamp = f"{stat.st_size}-{stat.st_mtime_ns}"
    kept = subprocess.run(
        [docker_cli(), "image", "inspect", "--format",
         f'{{{{index .Config.Labels "{_ROOTFS_LABEL}"}}}}', BASE_IMAGE],
        env=engine.env(), capture_output=True, text=True,
    )  # fmt: skip
    if kept.returncode != 0 or kept.stdout.strip() != stamp:
        change = f"LABEL {_ROOTFS_LABEL}={stamp}"
        argv = [docker_cli(), "import", "--change", change, str(tarball), BASE_IMAGE]
        _run(argv, env=engine.env())
    return BASE_IMAGE


def compose_argv(files: tuple[str, ...], *args: str) -> list[str]:
    """`docker-compose -f FILE ... ARGS`, run in COMPOSE_DIR."""
    return ["docker-compose", *(a for f in files for a in ("-f", f)), *args]


def build_image(engine: Engine) -> None:
    """The mesh's image (every service runs it: building the proxy's is enough), with the
    wheelhouse for an index; Docker's layer cache makes an unchanged build take seconds."""
    from compose import wheelhouse

    wheelhouse.build()
    argv = compose_argv(
        HOST_FILES, "build",
        "--build-arg", f"BASE_IMAGE={base_image(engine)}",
        "--build-arg", "PIP_ARGS=--no-index --find-links /app/compose/wheels",
        "proxy",
    )  # fmt: skip
    _run(argv, cwd=COMPOSE_DIR, env=engine.env(REDIS), timeout=900)
    engine.docker("image", "prune", "--force")  # the builds this one replaced


def provision() -> None:
    """What the smoke test needs of the machine, made beforehand as `./mesh test` installs
    the other servers the tests start (its set-up, when MESH_COMPOSE_SMOKE=1): the Debian
    tools, the base image's root filesystem, the wheelhouse and the mesh's image (about
    150 s on a fresh machine, then cached). The test makes whatever is still missing."""
    install_tools()
    with engine() as running:
        build_image(running)


if __name__ == "__main__":
    if sys.argv[1:] == ["--missing"]:
        print(" ".join(missing_packages()))
        sys.exit(0)
    try:
        provision()
    except EngineError as exc:  # the test will say so again, as a failure
        print(f"mesh: the Docker Compose smoke test's machine is not ready: {exc}")
