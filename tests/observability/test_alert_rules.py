"""The alert rules' timing, with Prometheus's own rule tester (`promtool test rules`, Debian's
prometheus package) over series written here: what should page or file a ticket does, what
a routine operation makes does not."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.observability.dashboard import DASHBOARD

RULES = DASHBOARD.parent / "prometheus-rules.yaml"
PASSED_OVER = "proxy_replicas_passed_over_total"


def _series(endpoint: str, proxy: str, values: str) -> dict[str, str]:
    labels = f'endpoint="{endpoint}", instance="{proxy}:8080", job="mesh-proxy"'
    return {"series": f"{PASSED_OVER}{{{labels}}}", "values": values}


def _firing(minutes: int, *endpoints: str) -> dict:
    samples = [
        {
            "labels": (
                'ALERTS{alertname="MeshReplicaFlapping", alertstate="firing", '
                f'endpoint="{endpoint}", severity="ticket"}}'
            ),
            "value": 1,
        }
        for endpoint in endpoints
    ]
    return {
        "expr": 'ALERTS{alertname="MeshReplicaFlapping", alertstate="firing"}',
        "eval_time": f"{minutes}m",
        "exp_samples": samples,
    }


def test_a_flapping_replica_files_a_ticket_and_a_rollout_does_not(tmp_path: Path) -> None:
    """One replica of `mlp` keeps failing (a spell every 4 minutes, one proxy sees it): a
    ticket once it has gone on for half an hour. A rollout of `det`'s four replicas, each
    passed over once by each of three proxies within three minutes (12 spells): none. The
    first rule summed every proxy's spells over 30 minutes and fired on such a rollout."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("CI must test the alert rules: promtool (Debian's prometheus) is missing")
        pytest.skip("promtool is missing (./mesh test installs prometheus when run as root)")
    mlp, det = "dns:///digits-mlp:8102", "dns:///ocr-det:8111"
    cases = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    _series(mlp, "p1", "0+0.25x90"),
                    *(_series(det, p, "0x10 1 2 3 4x80") for p in ("p1", "p2", "p3")),
                ],
                "promql_expr_test": [
                    _firing(20),  # the rollout's burst is in every window by now
                    _firing(35),  # mlp: spells for 35 minutes, pending its half hour
                    _firing(60, mlp),
                ],
            }
        ],
    }
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(yaml.safe_dump(cases))
    run = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
