"""The jobs' side of the manifests (docs/jobs.md), written by deploy.kubernetes.generate:

- `redis`: the compose service of that name as a one-replica StatefulSet of the official
  image (its command, hence the append-only file and volatile-lru, from compose), its data
  on a PersistentVolumeClaim, probed with redis-cli, reached through a headless Service by
  the proxy and the job workers only. The production overlay documents a managed Redis
  instead (PROXY_JOBS_URL on both Deployments, and this StatefulSet deleted).
- `job-worker`: the proxy's Deployment as a worker-only process (`python -m
  proxy.job_worker`, the same image, settings and pipelines; no doors, its one port serves
  /healthz, /readyz and /metrics), written only while the proxy's queue is a Redis that
  replicas share (an SQLite file is one pod's own). It scales on its own.
"""

from __future__ import annotations

import copy
import re

NAME = "redis"
WORKER = "job-worker"
IMAGE = "redis:7.2-bookworm"
"""The official image (Debian bookworm, Redis 7.2); its user is redis, uid 999."""
UID = 999
STORAGE = "2Gi"
MEMORY_MI = 768
"""Above compose's --maxmemory 512mb: the append-only file's rewrite forks."""


def _port(command: list[str]) -> int:
    return int(command[command.index("--port") + 1])


def _health_command(spec: dict) -> list[str]:
    """compose's CMD-SHELL test, asking the pod's own address (a Service name resolves only
    to ready pods, so it could never turn a starting pod ready)."""
    test = spec["healthcheck"]["test"]
    if test[0] != "CMD-SHELL":
        raise ValueError(f"{NAME}: expected a CMD-SHELL healthcheck, got {test[0]}")
    return ["sh", "-c", re.sub(rf"(?<![\w.-]){NAME}:(?=\d)", "127.0.0.1:", test[1])]


def redis(spec: dict, labels: dict[str, str], restricted: dict) -> list[dict]:
    """The StatefulSet and its headless Service."""
    command = [str(c) for c in spec["command"]]
    port = _port(command)
    check = {"exec": {"command": _health_command(spec)}}
    container = {
        "name": NAME,
        "image": IMAGE,
        "command": command,
        "ports": [{"name": "redis", "containerPort": port, "protocol": "TCP"}],
        "startupProbe": {**check, "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 90},
        "readinessProbe": {**check, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 6},
        "resources": {
            "requests": {"cpu": "250m", "memory": f"{MEMORY_MI}Mi"},
            "limits": {"cpu": "1000m", "memory": f"{MEMORY_MI}Mi"},
        },
        "securityContext": restricted,
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    pod = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    claim = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": STORAGE}}},
    }
    component = {**labels, "app.kubernetes.io/component": "queue"}
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": NAME, "labels": component},
        "spec": {
            "serviceName": NAME,
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": component}, "spec": pod},
            "volumeClaimTemplates": [claim],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "selector": labels,
            "ports": [{"name": "redis", "port": port, "targetPort": "redis", "protocol": "TCP"}],
        },
    }
    return [statefulset, service]


def shares_a_queue(proxy: dict) -> bool:
    """Whether the proxy's Deployment names a Redis queue (then job workers can share it)."""
    env = {e["name"]: e["value"] for e in proxy["spec"]["template"]["spec"]["containers"][0]["env"]}
    return env.get("PROXY_JOBS_URL", "").startswith(("redis://", "rediss://"))


def job_worker(proxy: dict, labels: dict[str, str]) -> dict:
    """The proxy's Deployment running `python -m proxy.job_worker`."""
    worker = copy.deepcopy(proxy)
    component = {**labels, "app.kubernetes.io/component": "job-worker"}
    worker["metadata"] = {"name": WORKER, "labels": component}
    worker["spec"]["selector"] = {"matchLabels": labels}
    template = worker["spec"]["template"]
    template["metadata"]["labels"] = component
    main = template["spec"]["containers"][0]
    main["name"] = WORKER
    main["command"] = ["python", "-m", "proxy.job_worker"]
    main["env"] = [
        {**e, "value": WORKER} if e["name"] == "OTEL_SERVICE_NAME" else e
        for e in main["env"]
        if e["name"] != "PROXY_GRPC_PORT"
    ]
    http = next(p for p in main["ports"] if p["name"] == "http")
    # Its one port serves health and metrics only: named so, the metrics policy admits it.
    main["ports"] = [{**http, "name": "metrics"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        main[probe]["httpGet"]["port"] = "metrics"
    template["metadata"]["annotations"]["prometheus.io/port"] = str(http["containerPort"])
    return worker
