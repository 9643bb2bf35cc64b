"""The production overlay's monitoring objects (deploy/kubernetes/overlays/production/
monitoring.yaml), for a cluster with the Prometheus Operator and Grafana's dashboard sidecar:
a PodMonitor scraping every pod of the mesh (the services' `metrics` port, the proxy's
`/metrics` on `http`), a PrometheusRule holding prometheus-rules.yaml, and a ConfigMap
holding the dashboard (label `grafana_dashboard: "1"`). Written with the dashboard by
`python -m deploy.observability.dashboard`, from the same files, never edited by hand."""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "prometheus-rules.yaml"
MONITORING = HERE.parent / "kubernetes" / "overlays" / "production" / "monitoring.yaml"
PART_OF = {"app.kubernetes.io/part-of": "inference-mesh"}


def objects(dashboard_json: str) -> list[dict]:
    labels = {**PART_OF, "app.kubernetes.io/component": "monitoring"}
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": {"name": "inference-mesh", "labels": labels},
            "spec": {
                "selector": {"matchLabels": PART_OF},
                # A pod without the named port is not scraped on that endpoint: the services
                # and job workers serve `metrics`, the proxy its REST port.
                "podMetricsEndpoints": [
                    {"port": "metrics", "path": "/metrics", "interval": "15s"},
                    {"port": "http", "path": "/metrics", "interval": "15s"},
                ],
            },
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "inference-mesh", "labels": labels},
            "spec": yaml.safe_load(RULES.read_text()),
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "inference-mesh-dashboard",
                "labels": {**labels, "grafana_dashboard": "1"},
            },
            "data": {"inference-mesh.json": dashboard_json},
        },
    ]


def render(dashboard_json: str) -> str:
    head = (
        "# Written by `python -m deploy.observability.dashboard` from deploy/observability/:\n"
        "# the Prometheus Operator's PodMonitor and PrometheusRule, Grafana's dashboard.\n"
    )
    return head + yaml.safe_dump_all(objects(dashboard_json), sort_keys=False, width=100)
