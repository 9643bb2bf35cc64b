from __future__ import annotations

import gc
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from bench import postgres_server, redis_server
from bench.foreign import servers as foreign
from compose.local import DEFAULT_FILE, LocalMesh
from compose.topology import load
from protos import pb_grpc
from tests import offsets, report
from tests.modelgen import build_test_repository
from tests.pki import PKI, make_pki
from tests.procs import ROOT, Service, start_service
from tests.workers import worker_index


def pytest_configure(config: pytest.Config) -> None:
    """Proxies the tests build or start keep their jobs in a folder of the run's own, never
    in the checkout's data/ (a test of jobs names its own store)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="mesh-tests-jobs-"))
    os.environ.setdefault("PROXY_JOBS_URL", f"sqlite:///{folder / 'jobs.sqlite3'}")


@pytest.fixture(scope="module", autouse=True)
def leaks_reported_in_their_module() -> Iterator[None]:
    """Garbage collected as each module ends: a socket or file a module's tests left open is
    reported (`filterwarnings = error`) at the teardown of its last test, not in whichever
    test of another module the collector happens to run during. A Redis connection left by
    the caches' tests once failed `test_streams.py`, which uses no Redis."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def predictor(test_repository: Path, workdir: Path) -> Iterator[Service]:
    """One real predictor process serving the test repository."""
    service = start_service(
        "predictors", ["--repository", str(test_repository), "--shared-memory", "true"], workdir
    )
    yield service
    service.stop()


@pytest.fixture(scope="session")
def predictor_stub(predictor: Service) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(predictor.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def v2_target() -> str | None:
    """V2_TARGET=host:port points the contract suite at any v2 server."""
    return os.environ.get("V2_TARGET") or None


@pytest.fixture(scope="session")
def preprocess_service(workdir: Path) -> Iterator[Service]:
    """One real preprocess process serving the shipped recipes."""
    service = start_service("preprocess", [], workdir)
    yield service
    service.stop()


PORT_OFFSET = offsets.session_mesh(worker_index())
"""The shared mesh's ports, beside a mesh a developer may be running with ./mesh up; each
pytest-xdist worker has a mesh of its own (tests/offsets.py says where, and why there)."""


TLS = ssl.create_default_context()
"""Built once for every client the tests make: httpx otherwise loads the CA bundle for each
new client (~50 ms of CPU), and some tests make one a request (38 of test_digits' 45 s)."""


@dataclass
class Mesh:
    local: LocalMesh
    url: str
    log: Path
    extra_pids: dict[str, int] = field(default_factory=dict)
    """extra_proxy's processes while they run, by URL."""

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, verify=TLS, **kwargs)

    @property
    def grpc_address(self) -> str:
        """The proxy's v2 gRPC door."""
        return f"127.0.0.1:{self.local.services['proxy'].env['PROXY_GRPC_PORT']}"

    @contextmanager
    def extra_proxy(self, port: int, wait_for: str = "/readyz", **env: str) -> Iterator[str]:
        """A second proxy process over this mesh's services, its environment changed by
        `env`; yields its URL once `wait_for` answers 200, stops it on exit."""
        full_env = {
            **os.environ,
            **self.local.services["proxy"].env,
            "PROXY_PORT": str(port),
            "PROXY_GRPC_PORT": "off",  # the mesh's proxy holds it
            **env,
        }
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy"],
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        self.extra_pids[url] = proxy.pid
        try:
            deadline = time.monotonic() + 60
            with httpx.Client(timeout=2, verify=TLS) as poll:
                while True:
                    try:
                        if poll.get(url + wait_for).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline and proxy.poll() is None, "not ready"
                    time.sleep(0.2)
            yield url
        finally:
            self.extra_pids.pop(url, None)
            proxy.terminate()
            proxy.wait(30)


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """The shipped topology (compose/compose.yaml) as real local processes."""
    log = tmp_path_factory.mktemp("mesh") / "mesh.log"
    # The suite measures and breaks the services themselves: its mesh answers every request
    # by running it (tests/e2e/test_cache.py runs a proxy with the shipped caches on). Its
    # jobs stay in SQLite (tests/e2e/test_run_command.py runs the topology with its Redis).
    environ = {"PROXY_CACHE": "false", "PROXY_JOBS_URL": f"sqlite:///{log.parent}/jobs.sqlite3"}
    services = load([DEFAULT_FILE], environ=environ, port_offset=PORT_OFFSET, leave_out={"redis"})
    with log.open("w") as out:
        local = LocalMesh(services, out=out)
        try:
            local.up(timeout=180)
        except Exception:
            local.down()
            raise RuntimeError(f"mesh did not come up:\n{log.read_text()[-5000:]}") from None
        port = services["proxy"].env["PROXY_PORT"]
        yield Mesh(local, f"http://127.0.0.1:{port}", log)
        local.down()


def _foreign(kind: str, workdir: Path) -> Iterator[foreign.Foreign]:
    """The digits MLP as `digits` on a foreign server (bench/foreign/). In CI it must run
    (`./mesh test` makes the venvs); elsewhere, without its venv, its tests are skipped."""
    if not foreign.available(kind):
        message = f"{foreign.VENVS[kind].name} is missing (./mesh test makes it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the foreign-server tests: {message}")
        pytest.skip(message)
    server = foreign.start(kind, workdir, foreign.NAME, foreign.ONNX)
    yield server
    server.stop()


def postgres_or_skip() -> postgres_server.PostgresServer:
    """A real PostgreSQL on 127.0.0.1 in a fresh cluster. In CI it must run (`./mesh test`
    installs Debian's postgresql as root); elsewhere, without it, its tests are skipped."""
    if not postgres_server.available():
        message = "PostgreSQL is missing (./mesh test installs it when run as root)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL tests: {message}")
        pytest.skip(message)
    return postgres_server.start()


def redis_or_skip(workdir: Path, **kwargs) -> redis_server.RedisServer:
    """A real Redis on 127.0.0.1. In CI it must run (`./mesh test` installs Debian's
    redis-server as root); elsewhere, without it, its tests are skipped."""
    if not redis_server.available():
        message = "redis-server is missing (./mesh test installs it when run as root)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Redis tests: {message}")
        pytest.skip(message)
    return redis_server.start(workdir, **kwargs)


def connected(client) -> int:
    """How many connections of a redis.asyncio client's pool are still open (a call made
    after its close opens one that nobody closes: a leaked socket)."""
    pool = client.connection_pool
    return sum(c.is_connected for c in [*pool._available_connections, *pool._in_use_connections])


@pytest.fixture(scope="session")
def redis_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_server.RedisServer]:
    """One Redis for the session (tests use keys of their own)."""
    server = redis_or_skip(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[foreign.Foreign]:
    """MLServer (its own venv) serving the digits MLP as `digits` (tests/foreign/)."""
    yield from _foreign("mlserver", tmp_path_factory.mktemp("mlserver"))


@pytest.fixture(scope="session")
def kserve_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[foreign.Foreign]:
    """KServe's model server (its own venv) serving the digits MLP as `digits`."""
    yield from _foreign("kserve", tmp_path_factory.mktemp("kserve"))


MEASURED: list[str] = []
"""report() lines of every test, as their reports arrive (from xdist's workers too)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    MEASURED.extend(value for name, value in report.user_properties if name == "measured")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MEASURED:
        terminalreporter.section("measured in this run")
        for line in MEASURED:
            terminalreporter.write_line(line)


_LOG_FROM = pytest.StashKey[int]()
MESH_LOG_SHOWN = 40_000
"""Bytes of the mesh's log shown with a failed test (its last ones)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A test on the shared mesh that fails shows what the mesh logged while it ran (the
    services' and the proxy's own words on a rare failure, which CI's clean machine would
    otherwise lose with its temporary folder)."""
    result: pytest.TestReport = yield
    if call.when == "teardown" and report.LINES:  # carried to the summary in the report
        result.user_properties.extend(("measured", line) for line in report.LINES)
        report.LINES.clear()
    mesh = getattr(item, "funcargs", {}).get("mesh")
    if not isinstance(mesh, Mesh) or not mesh.log.exists():
        return result
    if result.when == "setup":
        item.stash[_LOG_FROM] = mesh.log.stat().st_size
    elif result.failed:
        with mesh.log.open("rb") as log:
            log.seek(item.stash.get(_LOG_FROM, 0))
            during = log.read()
        cut = during[-MESH_LOG_SHOWN:].decode(errors="replace")
        result.sections.append(("mesh log while the test ran (its end)", cut))
    return result
