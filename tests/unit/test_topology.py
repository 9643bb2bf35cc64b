"""The local runner's reading of the shipped compose file: what moves with the port offset,
where named volumes go, and what a machine without redis-server runs instead."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from compose.local import DEFAULT_FILE, ROOT, busy_ports, main, ready_banner
from compose.topology import load, unavailable
from protos.ports import free_port


def test_redis_moves_with_the_offset_and_keeps_its_data_in_a_folder(tmp_path: Path) -> None:
    services = load([DEFAULT_FILE], environ={}, port_offset=1000, data_dir=tmp_path)
    redis = services["redis"]
    argv = redis.argv
    assert argv[argv.index("--port") + 1] == "7380"
    assert argv[argv.index("--bind") + 1] == "127.0.0.1"
    assert argv[argv.index("--dir") + 1] == str(tmp_path / "redis-data")
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert redis.folders == [tmp_path / "redis-data"]
    assert redis.healthcheck is not None and "redis://127.0.0.1:7380" in redis.healthcheck[-1]
    proxy = services["proxy"]
    assert proxy.env["PROXY_JOBS_URL"] == "redis://127.0.0.1:7380/0"
    assert "redis" in proxy.depends_on


def test_a_machine_without_redis_server_runs_the_rest_on_sqlite() -> None:
    missing = unavailable([DEFAULT_FILE], can_run=lambda program: program != "redis-server")
    assert missing == {"redis": "redis-server"}
    services = load([DEFAULT_FILE], environ={}, leave_out=set(missing))
    assert "redis" not in services
    proxy = services["proxy"]
    assert proxy.env["PROXY_JOBS_URL"] == ""  # unset: the proxy's SQLite default
    assert "redis" not in proxy.depends_on
    # Nothing else is touched.
    assert proxy.env["PREPROCESS_URL"] == "127.0.0.1:8002"


def test_a_queue_the_user_names_is_kept() -> None:
    environ = {"PROXY_JOBS_URL": "redis://queue.internal:6379/2"}
    services = load([DEFAULT_FILE], environ=environ, leave_out={"redis"})
    assert services["proxy"].env["PROXY_JOBS_URL"] == "redis://queue.internal:6379/2"


def test_the_api_key_callbacks_cors_and_prediction_log_reach_the_proxy_when_set() -> None:
    """Set before `./mesh up` / `docker compose up`: guarded and signed without editing the
    compose file (each was a setting compose never passed); unset, empty: off."""
    environ = {
        "PROXY_API_KEY": "k3y",
        "PROXY_JOBS_CALLBACK_HOSTS": "hooks.internal:8443",
        "PROXY_JOBS_CALLBACK_SECRET": "s3cret",
        "PROXY_CORS_ORIGINS": "https://app.example.com",
        "PROXY_PREDICTION_LOG": "https://collector.internal/events",
    }
    env = load([DEFAULT_FILE], environ=environ)["proxy"].env
    assert {name: env[name] for name in environ} == environ
    unset = load([DEFAULT_FILE], environ={})["proxy"].env
    assert [unset[name] for name in environ] == [""] * len(environ)


def test_a_prediction_log_in_the_stacks_redis_reaches_it_under_mesh_up() -> None:
    """The compose file's example, `redis://redis:6380/0`, is the local Redis under
    `./mesh up` (service names are 127.0.0.1 there), as the jobs' queue is."""
    environ = {"PROXY_PREDICTION_LOG": "redis://redis:6380/0?maxlen=1000"}
    env = load([DEFAULT_FILE], environ=environ)["proxy"].env
    assert env["PROXY_PREDICTION_LOG"] == "redis://127.0.0.1:6380/0?maxlen=1000"


def test_the_banner_names_every_port_and_commands_that_run_as_printed(tmp_path: Path) -> None:
    services = load([DEFAULT_FILE], environ={}, port_offset=1000, data_dir=tmp_path)
    banner = ready_banner(services)
    lines = {
        line.split()[0]: line.split()[-1] for line in banner.splitlines()[2:] if line[:2] == "  "
    }
    assert lines["redis"] == "127.0.0.1:7380"  # a --port argument, not a setting
    assert lines["proxy"] == "127.0.0.1:9080"
    assert "?" not in banner
    # The example commands name files the checkout has, from the folder ./mesh up runs in.
    files = re.findall(r"@([\w./-]+)", banner)
    assert files and all((ROOT / name).is_file() for name in files)


def test_a_port_in_use_stops_the_start_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `./mesh up` beside a first: the proxy alone failed to bind, the mesh stopped,
    and the reason was one line among 80 of the others starting and stopping."""
    port = free_port()
    offset = port - 8080  # the proxy's port, moved onto one this test holds
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        services = load([DEFAULT_FILE], environ={}, port_offset=offset, data_dir=tmp_path)
        assert ("proxy", port) in busy_ports(services)
        code = main(["--port-offset", str(offset), "--data", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"port {port} (proxy) is in use" in err and "--port-offset" in err
    assert ("proxy", port) not in busy_ports(services)
