"""`python -m deploy.kubernetes.generate`: write `deploy/kubernetes/base/` from the compose
topology (`compose/compose.yaml`, the one source of truth for what runs) and the measured
pod sizes (`deploy/capacity.json`), and the production overlay's autoscalers and disruption
budgets (`overlays/production/scaling.yaml`); the rest of the overlays is written by hand.
`--check` exits 1 when the committed files differ from what would be written (the tests
run it).

What differs from compose, on purpose: the proxy's endpoints are `dns:///<service>:<port>`
(each Service is headless, so the name resolves to every ready pod and the proxy spreads
calls and streams over them, proxy/transport/balancing.py); the pipeline file comes from a
ConfigMap; the model repository from an init container (below); healthchecks become
native probes (grpc.health.v1 for the services, /healthz for the proxy).

The model repository: a second image, `inference-mesh-models` (deploy/kubernetes/
models.Dockerfile: the built `models/repository`, ~30 MB), copied by an init container into
an emptyDir that the service mounts read-only at the path compose mounts it. Models then
ship and roll back by image tag like code, without a volume provisioner or a network
fetch at start, and the service image stays one image for every service. (KServe's
storage initializer does the same from a bucket; deploy/kserve/ uses it.)

Its length is the objects written out field by field, one function per kind (Deployment,
Service, NetworkPolicy, autoscaler and budget, kustomization); kept in one module so that
what each derives from compose reads in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
from pathlib import Path

import yaml

from compose.topology import interpolate, merged_specs
from deploy import capacity
from deploy.kubernetes import queue

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "compose.yaml"
PIPELINES = ROOT / "proxy" / "pipelines.yaml"
HERE = Path(__file__).resolve().parent

IMAGE = "inference-mesh"
MODELS_IMAGE = "inference-mesh-models"
REPOSITORY = "/app/models/repository"
PIPELINES_PATH = "/etc/mesh/pipelines.yaml"
PART_OF = {"app.kubernetes.io/part-of": "inference-mesh"}
USER = 10001
"""The image's user (compose/Dockerfile)."""
PRE_STOP_S = 5
"""Before SIGTERM: time for the endpoints (and the proxy's DNS look-ups) to drop the pod."""
DRAIN_S = 10 + 1
"""A service's grace_s + linger_s (v2server/settings.py); the proxy's graceful shutdown and
its gRPC door's grace are 10 s each, run together."""
TERMINATION_GRACE_S = 30


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, **PART_OF}


def _component(command: list[str]) -> str:
    return {"proxy": "proxy", "preprocess": "preprocess"}.get(command[2], "predictor")


def _env(name: str, spec: dict, inflight_mb: int | None = None) -> dict[str, str]:
    """The container's environment from compose's; `inflight_mb`: a service's bound on the
    bytes of requests it holds (capacity.service_inflight_mb)."""
    raw = spec.get("environment") or {}
    env = {str(k): interpolate(str(v), {}) for k, v in raw.items()}
    env = {k: v for k, v in env.items() if v}  # unset in compose: the setting's default
    if name == "proxy":
        for key, value in env.items():
            if key.endswith("_URL") and not key.startswith("PROXY_"):  # an endpoint
                env[key] = f"dns:///{value}"
        env["PROXY_PIPELINES"] = PIPELINES_PATH
        # Within its pod's memory limit (capacity.proxy_memory_limit_mi), not the default's.
        env["PROXY_MAX_INFLIGHT_MB"] = str(capacity.PROXY_INFLIGHT_MB)
    elif inflight_mb is not None:
        prefix = _component([str(c) for c in spec["command"]]).upper()  # PREDICTOR, PREPROCESS
        env[f"{prefix}_MAX_INFLIGHT_MB"] = str(inflight_mb)
    return env


def _ports(name: str, env: dict[str, str]) -> list[dict]:
    names = {"PORT": "http" if name == "proxy" else "grpc", "GRPC_PORT": "grpc"}
    ports = []
    for key, value in env.items():
        suffix = key.split("_", 1)[1] if "_" in key else key
        if key.endswith("_PORT") and value.isdigit():
            port_name = "metrics" if suffix == "METRICS_PORT" else names.get(suffix)
            if port_name:
                ports.append({"name": port_name, "containerPort": int(value), "protocol": "TCP"})
    return ports


def _probes(name: str) -> dict:
    if name == "proxy":
        # Ready when it answers, not when everything it calls does: every replica sees the
        # same services and queue, so a /readyz probe would take them all out of the Service
        # at once when one model's pods or Redis are down (a broken OCR roll-out then stops
        # digits too, and clients get refused connections instead of a 503 naming the cause).
        # Draining is the preStop pause's job. /readyz stays the report to look at.
        ready = live = {"httpGet": {"path": "/healthz", "port": "http"}}
    else:
        ready = live = {"grpc": {"port": 0}}  # the port is set below (grpc probes take a number)
    # compose: every 5 s, 3 s timeout; start-up (loading models) up to 3 minutes.
    return {
        "startupProbe": {**live, "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 90},
        "readinessProbe": {**ready, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {**live, "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 6},
    }


def _restricted() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def deployment(name: str, spec: dict, size: capacity.Size, inflight_mb: int | None = None) -> dict:
    command = [str(c) for c in spec["command"]]
    env = _env(name, spec, inflight_mb)
    ports = _ports(name, env)
    probes = _probes(name)
    if name != "proxy":
        grpc_port = next(p["containerPort"] for p in ports if p["name"] == "grpc")
        for probe in probes.values():
            probe["grpc"] = {"port": grpc_port}
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict] = [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    init: list[dict] = []
    # The preprocess service reads the repository too: the `ocr` recipe's CTC decoding takes
    # the recogniser's characters file from it (preprocess/recipes.yaml). Without the mount
    # its pod could not start (compose mounts the repository in every service).
    if REPOSITORY in env.values() or name == "preprocess":
        mounts.append({"name": "models", "mountPath": REPOSITORY, "readOnly": True})
        volumes.append({"name": "models", "emptyDir": {"sizeLimit": "1Gi"}})
        init.append(
            {
                "name": "models",
                "image": MODELS_IMAGE,
                "command": ["cp", "-R", "/models/.", REPOSITORY],
                "volumeMounts": [{"name": "models", "mountPath": REPOSITORY}],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "32Mi"},
                    "limits": {"cpu": "500m", "memory": "64Mi"},
                },
                "securityContext": _restricted(),
            }
        )
    if name == "proxy":
        mounts.append({"name": "pipelines", "mountPath": "/etc/mesh", "readOnly": True})
        volumes.append({"name": "pipelines", "configMap": {"name": "proxy-pipelines"}})
        # The jobs' SQLite file when PROXY_JOBS_URL names no Redis (one pod's own).
        mounts.append({"name": "data", "mountPath": "/app/data"})
        volumes.append({"name": "data", "emptyDir": {"sizeLimit": "1Gi"}})
    container = {
        "name": name,
        "image": IMAGE,
        "command": command,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": ports,
        **probes,
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_S)]}}},
        "resources": {
            "requests": {"cpu": f"{size.cpu_m}m", "memory": f"{size.memory_mi}Mi"},
            "limits": {"cpu": f"{size.cpu_limit_m}m", "memory": f"{size.memory_limit_mi}Mi"},
        },
        "securityContext": _restricted(),
        "volumeMounts": mounts,
    }
    pod: dict = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER,
            "runAsGroup": USER,
            "fsGroup": USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        **({"initContainers": init} if init else {}),
        "containers": [container],
        "volumes": volumes,
    }
    labels = {**_labels(name), "app.kubernetes.io/component": _component(command)}
    metrics = next((p for p in ports if p["name"] == "metrics"), None)
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(
            metrics["containerPort"] if metrics else ports[0]["containerPort"]
        ),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _labels(name)},
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod},
        },
    }


def service(name: str, spec: dict) -> dict:
    ports = _ports(name, _env(name, spec))
    body: dict = {
        "selector": _labels(name),
        "ports": [
            {
                "name": p["name"],
                "port": p["containerPort"],
                "targetPort": p["name"],
                "protocol": "TCP",
                **({"appProtocol": "kubernetes.io/h2c"} if p["name"] == "grpc" else {}),
            }
            for p in ports
        ],
    }
    if name != "proxy":
        # Headless: the name resolves to every ready pod, for the proxy to balance over.
        body = {"clusterIP": "None", **body}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": body,
    }


def network_policies(names: list[str]) -> list[dict]:
    """Nothing reaches a mesh pod unless admitted: the proxy's doors from anywhere, each
    service's gRPC port from the proxy (and the job workers) only, the jobs' Redis from the
    same, every metrics port from the `monitoring` namespace."""

    def policy(name: str, selector: dict, ingress: list[dict]) -> dict:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": PART_OF},
            "spec": {
                "podSelector": {"matchLabels": selector},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }

    callers = [{"podSelector": {"matchLabels": _labels("proxy")}}]
    if queue.WORKER in names:
        callers.append({"podSelector": {"matchLabels": _labels(queue.WORKER)}})
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    policies = [
        policy("mesh-default-deny", PART_OF, []),
        policy(
            "proxy-doors",
            _labels("proxy"),
            [{"ports": [{"port": "http", "protocol": "TCP"}, {"port": "grpc", "protocol": "TCP"}]}],
        ),
        policy("mesh-metrics", PART_OF, [{"from": [monitoring], "ports": [{"port": "metrics"}]}]),
    ]
    for name in names:
        if name == queue.NAME:
            rule = {"from": callers, "ports": [{"port": "redis", "protocol": "TCP"}]}
            policies.append(policy(f"{name}-from-mesh", _labels(name), [rule]))
        elif name not in ("proxy", queue.WORKER):
            rule = {"from": callers, "ports": [{"port": "grpc", "protocol": "TCP"}]}
            policies.append(policy(f"{name}-from-proxy", _labels(name), [rule]))
    return policies


def kustomization(files: list[str]) -> dict:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "labels": [{"pairs": PART_OF, "includeSelectors": False}],
        "resources": files,
        "configMapGenerator": [{"name": "proxy-pipelines", "files": ["pipelines.yaml"]}],
        "images": [{"name": IMAGE, "newTag": "latest"}, {"name": MODELS_IMAGE, "newTag": "latest"}],
    }


HEADER = (
    "# Written by `python -m deploy.kubernetes.generate` from compose/compose.yaml; do not edit.\n"
)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: object) -> bool:
        return True  # no &id001 anchors: a shared dict is written out each time


def _dump(documents: list[dict]) -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100) for d in documents)
    return HEADER + body


PRODUCTION_RATES = {"digits": 2000.0, "ocr": 20.0}
"""The production overlay's design load (requests/s per pipeline): its autoscalers may grow
each service to 1.5x the replicas `deploy.capacity` plans for it."""


def scaling(names: list[str]) -> list[dict]:
    """A HorizontalPodAutoscaler (CPU, at the capacity plan's utilisation) and a
    PodDisruptionBudget for every service."""
    plan = capacity.replicas(capacity.load(), PRODUCTION_RATES)
    plan[queue.WORKER] = plan["proxy"]  # a worker runs what a proxy would
    out: list[dict] = []
    for name in names:
        ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        target = {"type": "Utilization", "averageUtilization": int(100 * capacity.UTILISATION)}
        out.append(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": name, "labels": _labels(name)},
                "spec": {
                    "scaleTargetRef": ref,
                    "minReplicas": 2,
                    "maxReplicas": max(3, -(-3 * plan[name] // 2)),
                    "metrics": [
                        {"type": "Resource", "resource": {"name": "cpu", "target": target}}
                    ],
                },
            }
        )
        out.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "labels": _labels(name)},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _labels(name)}},
            }
        )
    return out


def render() -> dict[str, str]:
    """Every generated file, by its path under deploy/kubernetes/."""
    specs = merged_specs([COMPOSE])
    measured = capacity.load()
    sized = capacity.sizes(measured)
    proxy = sized["proxy"]
    wanted = capacity.proxy_memory_limit_mi(
        measured["peak_memory_mib"]["proxy"], yaml.safe_load(PIPELINES.read_text())["pipelines"]
    )
    sized["proxy"] = dataclasses.replace(proxy, limit_mi=max(proxy.memory_limit_mi, wanted))
    files: dict[str, str] = {}
    deployed: list[str] = []
    for name, spec in specs.items():
        if name == queue.NAME:
            files[f"base/{name}.yaml"] = _dump(queue.redis(spec, _labels(name), _restricted()))
            continue
        peak = measured["peak_memory_mib"][name]
        inflight = None if name == "proxy" else capacity.service_inflight_mb(peak, sized[name])
        made = deployment(name, spec, sized[name], inflight)
        files[f"base/{name}.yaml"] = _dump([made, service(name, spec)])
        deployed.append(name)
        if name == "proxy" and queue.shares_a_queue(made):
            worker = queue.job_worker(made, _labels(queue.WORKER))
            files[f"base/{queue.WORKER}.yaml"] = _dump([worker])
            deployed.append(queue.WORKER)
    stores = [n for n in specs if n == queue.NAME]
    files["base/networkpolicy.yaml"] = _dump(network_policies(stores + deployed))
    resources = [Path(path).name for path in files]
    files["base/kustomization.yaml"] = _dump([kustomization(resources)])
    files["base/pipelines.yaml"] = PIPELINES.read_text()
    files["overlays/production/scaling.yaml"] = _dump(scaling(deployed))
    return files


def write(root: Path = HERE) -> None:
    for path, text in render().items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def check(root: Path = HERE) -> list[str]:
    """Differences between the committed files and fresh ones (empty: up to date)."""
    fresh = render()
    stale = {f"base/{p.name}" for p in (root / "base").glob("*")} - set(fresh)
    diffs = [f"base has a file the generator does not write: {p}" for p in sorted(stale)]
    for path, text in fresh.items():
        committed = (root / path).read_text() if (root / path).exists() else ""
        if committed != text:
            diffs += difflib.unified_diff(
                committed.splitlines(),
                text.splitlines(),
                f"committed/{path}",
                f"fresh/{path}",
                lineterm="",
            )
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.kubernetes.generate", description=__doc__
    )
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    if args.check:
        diffs = check()
        print("\n".join(diffs) or "base is up to date")
        return 1 if diffs else 0
    write()
    print(f"written under {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
