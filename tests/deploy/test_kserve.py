"""The KServe objects (deploy/kserve/) against the kserve package's models, and the overlay
that points the proxy at the InferenceServices."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from predictors.settings import TRITON_FLAGS, PredictorSettings
from protos.cli import renamed
from proxy.engine import plan
from tests.deploy.test_kubernetes import container, env_of, objects
from tests.procs import ROOT

KSERVE = ROOT / "deploy" / "kserve"
PYTHON = ROOT / ".venv-kserve" / "bin" / "python"


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} missing: ./mesh test creates it (deploy/kserve/requirements.txt)")
    command = [str(PYTHON), str(KSERVE / "validate.py"), *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_runtime_and_inference_services_are_valid_kserve_objects() -> None:
    done = validate(KSERVE / "servingruntime.yaml", KSERVE / "inferenceservices.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("valid ") == 4


def test_the_validator_names_what_kserve_would_refuse(tmp_path: Path) -> None:
    runtime = yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())
    runtime["spec"]["protocolVersion"] = runtime["spec"].pop("protocolVersions")
    isvc = next(yaml.safe_load_all((KSERVE / "inferenceservices.yaml").read_text()))
    isvc["spec"]["predictor"]["minReplicas"] = "two"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([runtime, isvc]))
    done = validate(bad)
    assert done.returncode == 1
    assert "has no field 'protocolVersion'" in done.stdout
    assert "minReplicas: expected int" in done.stdout


def test_the_runtime_maps_kserve_conventions_onto_the_predictor_flags() -> None:
    runtime = yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())
    main = runtime["spec"]["containers"][0]
    assert main["name"] == "kserve-container"  # the container KServe fills in
    assert "--model-repository=/mnt/models" in main["args"]  # where storageUri lands
    port = next(a for a in main["args"] if a.startswith("--grpc-port=")).split("=")[1]
    assert main["ports"] == [{"name": "h2c", "containerPort": int(port), "protocol": "TCP"}]
    assert runtime["spec"]["protocolVersions"] == ["grpc-v2"]
    # The flags parse as the predictor parses them (Triton's names, protos/cli.py).
    settings = PredictorSettings(_cli_parse_args=renamed(main["args"], TRITON_FLAGS))
    assert (str(settings.repository), settings.port) == ("/mnt/models", int(port))


def test_the_proxy_reaches_the_inference_services_by_environment_variable() -> None:
    deployments = objects("kserve", "Deployment")
    assert not any(name.startswith("digits-") for name in deployments)
    isvcs = {d["metadata"]["name"] for d in objects_of_kind("InferenceService")}
    env = env_of(deployments["proxy"])
    targets = plan.load(ROOT / "proxy" / "pipelines.yaml", env)["digits"].targets
    hosts = {t.address.split(":")[0] for name, t in targets.items() if name != "preprocess"}
    assert hosts == {f"{isvc}-predictor" for isvc in isvcs}
    assert int(env["PROXY_CONNECTIONS_PER_ENDPOINT"]) > 1  # a ClusterIP balances connections
    assert container(deployments["proxy"])["image"].startswith("inference-mesh")


def objects_of_kind(kind: str) -> list[dict]:
    return list(objects("kserve", kind).values())
