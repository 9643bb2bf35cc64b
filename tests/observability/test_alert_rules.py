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


def _firing(alert: str, minutes: int, *labelled: str, severity: str = "ticket") -> dict:
    """The test that at `minutes` exactly the alerts of `labelled` (each `name="value"`, or
    "" for an alert of no labels beyond its own) fire."""
    samples = [
        {
            "labels": (
                f'ALERTS{{alertname="{alert}", alertstate="firing", '
                f'{labels + ", " if labels else ""}severity="{severity}"}}'
            ),
            "value": 1,
        }
        for labels in labelled
    ]
    return {
        "expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}',
        "eval_time": f"{minutes}m",
        "exp_samples": samples,
    }


def _promtool(tmp_path: Path, tests: list[dict]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("CI must test the alert rules: promtool (Debian's prometheus) is missing")
        pytest.skip("promtool is missing (./mesh test installs prometheus when run as root)")
    spec = tmp_path / "rules_test.yaml"
    cases = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}
    spec.write_text(yaml.safe_dump(cases))
    run = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_flapping_replica_files_a_ticket_and_a_rollout_does_not(tmp_path: Path) -> None:
    """One replica of `mlp` keeps failing (a spell every 4 minutes, one proxy sees it): a
    ticket once it has gone on for half an hour. A rollout of `det`'s four replicas, each
    passed over once by each of three proxies within three minutes (12 spells): none. The
    first rule summed every proxy's spells over 30 minutes and fired on such a rollout."""
    mlp, det = "dns:///digits-mlp:8102", "dns:///ocr-det:8111"
    flapping = "MeshReplicaFlapping"
    test = {
        "interval": "1m",
        "input_series": [
            _series(mlp, "p1", "0+0.25x90"),
            *(_series(det, p, "0x10 1 2 3 4x80") for p in ("p1", "p2", "p3")),
        ],
        "promql_expr_test": [
            _firing(flapping, 20),  # the rollout's burst is in every window by now
            _firing(flapping, 35),  # mlp: spells for 35 minutes, pending its half hour
            _firing(flapping, 60, f'endpoint="{mlp}"'),
        ],
    }
    _promtool(tmp_path, [test])


def test_a_pipeline_answering_5xx_pages_after_five_minutes(tmp_path: Path) -> None:
    """`ocr` answers 10% 503 from the 10th minute on, `digits` 3% all along: `ocr` pages once
    the share has held for five minutes, `digits` never (under the 5% threshold)."""

    def answers(pipeline: str, status: str, values: str) -> dict[str, str]:
        labels = f'pipeline="{pipeline}", status="{status}", instance="p1:8080", job="mesh-proxy"'
        return {"series": f"proxy_requests_total{{{labels}}}", "values": values}

    test = {
        "interval": "1m",
        "input_series": [
            answers("ocr", "200", "0+600x40"),
            answers("ocr", "503", "0x10 0+60x30"),
            answers("digits", "200", "0+6000x40"),
            answers("digits", "504", "0+180x40"),
        ],
        "promql_expr_test": [
            _firing("MeshPipelineErrors", 14, severity="page"),  # pending its five minutes
            _firing("MeshPipelineErrors", 25, 'pipeline="ocr"', severity="page"),
        ],
    }
    _promtool(tmp_path, [test])


def test_a_failing_canary_files_a_ticket_and_a_failing_endpoint_does_not_blame_it(
    tmp_path: Path,
) -> None:
    """`ensemble/mlp`'s canary fails 10% of its calls from the 10th minute on while the live
    model fails none: a ticket after five minutes. `preprocess`'s canary and live model both
    fail 10% (the endpoint's fault, not the canary's): none. `ensemble/forest`'s canary fails
    3%: none."""

    def calls(step: str, variant: str, status: str, values: str) -> dict[str, str]:
        labels = (
            f'pipeline="digits", step="{step}", variant="{variant}", status="{status}", '
            'instance="p1:8080", job="mesh-proxy"'
        )
        return {"series": f"proxy_canary_step_duration_seconds_count{{{labels}}}", "values": values}

    test = {
        "interval": "1m",
        "input_series": [
            calls("ensemble/mlp", "live", "ok", "0+540x40"),
            calls("ensemble/mlp", "canary", "ok", "0+54x40"),
            calls("ensemble/mlp", "canary", "unavailable", "0x10 0+6x30"),
            *(calls("preprocess", v, "ok", "0+540x40") for v in ("live", "canary")),
            *(calls("preprocess", v, "unavailable", "0+60x40") for v in ("live", "canary")),
            calls("ensemble/forest", "live", "ok", "0+600x40"),
            calls("ensemble/forest", "canary", "ok", "0+582x40"),
            calls("ensemble/forest", "canary", "internal", "0+18x40"),
        ],
        "promql_expr_test": [
            _firing("MeshCanaryFailing", 14),  # pending its five minutes
            _firing(
                "MeshCanaryFailing", 25, 'pipeline="digits", step="ensemble/mlp", variant="canary"'
            ),
        ],
    }
    _promtool(tmp_path, [test])


def test_a_prediction_log_losing_records_files_a_ticket_and_a_trickle_does_not(
    tmp_path: Path,
) -> None:
    """Proxy p1's prediction log drops 5% of its records from the 10th minute on (its sink too
    slow): a ticket once the 15-minute rate and the 15 minutes pending are past. Over both
    proxies 0.4% dropped, on p2 alone: none."""

    def records(proxy: str, outcome: str, values: str) -> dict[str, str]:
        labels = f'outcome="{outcome}", instance="{proxy}:8080", job="mesh-proxy"'
        return {"series": f"proxy_prediction_log_records_total{{{labels}}}", "values": values}

    losing = {
        "interval": "1m",
        "input_series": [
            records("p1", "written", "0+1000x10 10000+950x50"),
            records("p1", "dropped", "0x10 0+50x50"),
            records("p1", "failed", "0x60"),
        ],
        "promql_expr_test": [
            _firing("MeshPredictionLogLosing", 20),  # pending its fifteen minutes
            _firing("MeshPredictionLogLosing", 45, ""),
        ],
    }
    trickle = {
        "interval": "1m",
        "input_series": [
            records("p1", "written", "0+1000x60"),
            records("p2", "written", "0+996x60"),
            records("p2", "dropped", "0+8x60"),
        ],
        "promql_expr_test": [_firing("MeshPredictionLogLosing", 50)],
    }
    _promtool(tmp_path, [losing, trickle])
