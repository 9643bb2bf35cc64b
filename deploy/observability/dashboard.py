"""The mesh's Grafana dashboard (mesh-dashboard.json beside this file), written from the panel
list in panels.py so that each panel's PromQL is in one place, with the Kubernetes objects that
carry it and the rules (operator.py); `python -m deploy.observability.dashboard --check` fails when
the committed files are not what this writes (tests/deploy run it).

Every query reads the metrics the processes serve (docs/operating.md, "Metrics") through a
Prometheus data source chosen when the dashboard is imported (`${datasource}`);
tests/observability/test_prometheus.py runs each against a real Prometheus scraping a
running mesh."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from deploy.observability import operator
from deploy.observability.panels import PANELS

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "mesh-dashboard.json"


def dashboard() -> dict:
    panels = []
    for i, panel in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": panel.title,
                "description": panel.description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        "expr": expr,
                        "legendFormat": legend,
                    }
                    for j, (legend, expr) in enumerate(panel.queries.items())
                ],
            }
        )
    return {
        "title": "Inference mesh",
        "uid": "inference-mesh",
        "tags": ["inference-mesh"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                }
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Write the dashboard and the production overlay's monitoring objects; `--check`: fail
    when the committed files are not what would be written."""
    text = render()
    files = {DASHBOARD: text, operator.MONITORING: operator.render(text)}
    if "--check" in argv:
        stale = [path for path, content in files.items() if not _same(path, content)]
        for path in stale:
            print(f"{path} is out of date: python -m deploy.observability.dashboard")
        return 1 if stale else 0
    for path, content in files.items():
        path.write_text(content)
        print(f"written {path}")
    return 0


def _same(path: Path, content: str) -> bool:
    return path.exists() and path.read_text() == content


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
