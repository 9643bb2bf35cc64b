"""The real `docker compose up`: images built from compose/Dockerfile, the shipped
compose files, both pipelines over REST, a predictor swapped by environment variable, jobs
kept in the compose Redis across its restart.

Runs when MESH_COMPOSE_SMOKE=1 (CI sets it; it needs root to install Debian's docker.io,
docker-compose and mmdebstrap, which `./mesh test` then does in its set-up with the base
image's root filesystem, the wheelhouse and the image, and starts a private dockerd). Host
networking (compose.host.yaml) keeps every hop on 127.0.0.1; a last test runs the plain file
on the engine's own network, publishing the proxy on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.inprocess import InProcess
from compose import topology
from samples.images import text_samples
from tests.compose import engine as docker
from tests.e2e.test_digits import held_out, png
from tests.e2e.test_v2_door import probe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("MESH_COMPOSE_SMOKE") != "1",
        reason="set MESH_COMPOSE_SMOKE=1 to run docker compose for real (root; CI does)",
    ),
]

HOST_FILES = docker.HOST_FILES
BRIDGE_PUBLISH = "127.0.0.1:18080"
BRIDGE_GRPC_PUBLISH = "127.0.0.1:18081"
REDIS = docker.REDIS


@dataclass
class Compose:
    engine: docker.Engine
    files: tuple[str, ...]
    env: dict[str, str] = field(default_factory=lambda: dict(REDIS))

    def run(self, *args: str, extra: Mapping[str, str] | None = None, timeout: float = 300) -> str:
        argv = docker.compose_argv(self.files, *args)
        done = subprocess.run(
            argv,
            cwd=docker.COMPOSE_DIR,
            env=self.engine.env({**self.env, **(extra or {})}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
        return done.stdout

    def containers(self) -> dict[str, dict]:
        """`docker inspect` of each running container, by compose service name."""
        ids = self.run("ps", "-q").split()
        found = json.loads(self.engine.docker("inspect", *ids)) if ids else []
        return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in found}

    def health(self) -> dict[str, str]:
        return {
            name: c["State"].get("Health", {}).get("Status", c["State"]["Status"])
            for name, c in self.containers().items()
        }

    def wait_healthy(self, timeout_s: float = 240) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        health: dict[str, str] = {}
        while time.monotonic() < deadline:
            health = self.health()
            if health and all(s == "healthy" for s in health.values()):
                return health
            time.sleep(1)
        logs = self.run("logs", "--no-color", "--tail", "20")
        raise AssertionError(f"not healthy after {timeout_s:.0f} s: {health}\n{logs[-6000:]}")


def _listening_ports() -> list[int]:
    services = topology.load([docker.COMPOSE_DIR / "compose.yaml"], environ={})
    ports = [int(v) for s in services.values() for k, v in s.env.items() if k.endswith("_PORT")]
    redis = services["redis"].argv
    return sorted([*ports, int(redis[redis.index("--port") + 1])])


def _assert_free(ports: list[int]) -> None:
    taken = []
    for port in ports:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    assert not taken, f"ports {taken} on 127.0.0.1 are in use (is `./mesh up` running?)"


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.Engine]:
    with docker.engine() as running:
        docker.build_image(running)  # from the layer cache when the set-up built it
        yield running


@pytest.fixture(scope="module")
def host_mesh(engine: docker.Engine) -> Iterator[Compose]:
    _assert_free(_listening_ports())
    mesh = Compose(engine, HOST_FILES)
    mesh.run("up", "-d", "--no-build")
    try:
        mesh.wait_healthy()
        yield mesh
    finally:
        mesh.run("down", "--timeout", "10")


def _digits(url: str, image: np.ndarray) -> dict:
    r = httpx.post(
        f"{url}/v1/pipelines/digits/infer",
        content=png(image),
        headers={"Content-Type": "image/png"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_every_service_is_healthy_and_not_root(host_mesh: Compose) -> None:
    containers = host_mesh.containers()
    expected = set(topology.load([docker.COMPOSE_DIR / "compose.yaml"], environ={}))
    assert set(containers) == expected
    for name, c in containers.items():
        assert c["State"]["Health"]["Status"] == "healthy", name
        assert c["HostConfig"]["NetworkMode"] == "host", name
        if name != "redis":  # REDIS_IMAGE's own user
            assert c["Config"]["User"] == "mesh", name
    ready = httpx.get("http://127.0.0.1:8080/readyz", timeout=10).json()
    assert ready["ready"] is True and all(e["ready"] for e in ready["endpoints"].values())


def test_both_pipelines_answer_like_one_process(host_mesh: Compose) -> None:
    local = InProcess()
    images, _ = held_out()
    for i in range(0, 40, 4):
        result = _digits("http://127.0.0.1:8080", images[i])
        expected = local.digits(png(images[i]))
        assert result["label"] == expected["label"]
        np.testing.assert_allclose(result["probabilities"], expected["probabilities"], atol=1e-5)
    for blob, truth in text_samples(3, seed=7):
        r = httpx.post(
            "http://127.0.0.1:8080/v1/pipelines/ocr/infer",
            files={"file": ("page.png", blob)},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        texts = [line["text"] for line in r.json()["result"]["lines"]]
        assert texts == [line["text"] for line in local.ocr(blob)["lines"]], truth


def _finished(url: str, location: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        job = httpx.get(url + location, timeout=10).json()
        if job["status"] not in ("queued", "running"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def test_jobs_live_in_the_compose_redis_and_survive_its_restart(host_mesh: Compose) -> None:
    url = "http://127.0.0.1:8080"
    ready = httpx.get(f"{url}/readyz", timeout=10).json()["endpoints"]
    assert ready["PROXY_JOBS_URL/jobs"]["address"] == "redis://127.0.0.1:6380/0"
    images, _ = held_out()
    r = httpx.post(
        f"{url}/v1/pipelines/digits/jobs",
        content=png(images[3]),
        headers={"Content-Type": "image/png"},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    job = _finished(url, r.headers["Location"])
    assert job["status"] == "succeeded", job
    assert job["result"]["result"]["label"] == _digits(url, images[3])["label"]
    # The append-only file on the compose volume keeps the job across a restart.
    host_mesh.run("restart", "redis")
    host_mesh.wait_healthy()
    again = httpx.get(url + r.headers["Location"], timeout=10)
    assert again.status_code == 200 and again.json()["result"] == job["result"]


def test_the_batch_example_runs_a_folder_through_the_mesh(
    host_mesh: Compose, tmp_path: Path
) -> None:
    images, _ = held_out()
    folder = tmp_path / "batch"
    (folder / "photos").mkdir(parents=True)
    for i in range(5):
        (folder / "photos" / f"{i}.png").write_bytes(png(images[i]))
    folder.chmod(0o777)  # the container's user writes the answers there
    host_mesh.run(
        "run", "--rm", "batch", "digits", "/batch/photos", "-o", "/batch/answers.jsonl",
        extra={"BATCH_DIR": str(folder)},
    )  # fmt: skip
    answers = [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()]
    assert sorted(a["key"] for a in answers) == [f"{i}.png" for i in range(5)]
    for answer in answers:
        i = int(answer["key"].split(".")[0])
        assert (
            answer["result"]["result"]["label"]
            == _digits("http://127.0.0.1:8080", images[i])["label"]
        )


def test_an_env_var_swaps_a_predictor(host_mesh: Compose) -> None:
    # Re-point the "mlp" branch at the logistic-regression container; only the proxy is
    # re-created, the predictors keep running.
    before = {name: c["Id"] for name, c in host_mesh.containers().items()}
    swap = {"PREDICTOR_DIGITS_MLP_URL": "127.0.0.1:8101/digits_logreg"}
    host_mesh.run("up", "-d", "--no-build", "proxy", extra=swap)
    host_mesh.wait_healthy()
    after = {name: c["Id"] for name, c in host_mesh.containers().items()}
    assert after["proxy"] != before["proxy"]
    assert {k: v for k, v in after.items() if k != "proxy"} == {
        k: v for k, v in before.items() if k != "proxy"
    }
    images, _ = held_out()
    members = _digits("http://127.0.0.1:8080", images[5])["members"]
    np.testing.assert_allclose(
        members["mlp"]["probabilities"], members["logreg"]["probabilities"], rtol=1e-6
    )
    listing = httpx.get("http://127.0.0.1:8080/v1/pipelines", timeout=10).json()
    assert listing["digits"]["targets"]["ensemble/mlp"]["model"] == "digits_logreg"


def test_plain_file_on_the_engine_network(
    engine: docker.Engine, host_mesh: Compose, tmp_path: Path
) -> None:
    # After the host-network tests (module fixtures end last): the file users run as it is,
    # service names resolved by the engine's DNS, the override publishing the proxy.
    host_mesh.run("down", "--timeout", "10")
    mesh = Compose(
        engine,
        ("compose.yaml", "compose.override.yaml"),
        {**REDIS, "PROXY_PUBLISH": BRIDGE_PUBLISH, "PROXY_GRPC_PUBLISH": BRIDGE_GRPC_PUBLISH},
    )
    mesh.run("up", "-d", "--no-build")
    try:
        mesh.wait_healthy()
        proxy = mesh.containers()["proxy"]
        assert proxy["HostConfig"]["PortBindings"] == {
            "8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": "18080"}],
            "8081/tcp": [{"HostIp": "127.0.0.1", "HostPort": "18081"}],
        }
        images, _ = held_out()
        result = _digits(f"http://{BRIDGE_PUBLISH}", images[0])
        assert result["label"] == InProcess().digits(png(images[0]))["label"]
        seen = probe(BRIDGE_GRPC_PUBLISH, "digits", [png(images[0])], tmp_path)
        assert seen["unary"][0]["label"]["data"] == [result["label"]]
        ready = httpx.get(f"http://{BRIDGE_PUBLISH}/readyz", timeout=10).json()
        assert ready["endpoints"]["PREPROCESS_URL/digits_input"]["address"] == "preprocess:8002"
    finally:
        mesh.run("down", "--timeout", "10")
