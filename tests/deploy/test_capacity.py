"""The capacity plan (deploy/capacity.py): its arithmetic on figures worked out by hand, and
the command on the measured file."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deploy import capacity
from tests.procs import ROOT

MEASURED = {
    "measured": "test",
    "machine": "x86_64, 2 CPUs, load generator on the same",
    "cpus": 2,
    "pipelines": {
        "a": {
            "cpu_ms_per_request": {"proxy": 1.0, "model": 0.5, "big": 0.0},
            "event_loop_ms_per_request": {"proxy": 0.8, "model": 0.2, "big": 0.0},
        },
        "b": {
            "cpu_ms_per_request": {"proxy": 2.0, "model": 0.0, "big": 100.0},
            "event_loop_ms_per_request": {"proxy": 1.6, "model": 0.0, "big": 1.0},
        },
    },
    "peak_memory_mib": {"proxy": 100.0, "model": 50.0, "big": 1000.0},
}


def test_pods_are_sized_to_what_one_proxy_replica_sends() -> None:
    sizes = capacity.sizes(MEASURED)
    # proxy: 0.7 * 1.0 / 0.8 = 0.875 cores (pipeline a; b gives 0.7 * 2 / 1.6, the same)
    assert sizes["proxy"].cpu_m == 900
    # model: 0.7 * 0.5 / 0.8 = 0.4375 -> 450m
    assert sizes["model"].cpu_m == 450
    # big: 0.7 * 100 / 1.6 = 43.75 cores, capped at the 2 measured
    assert sizes["big"].cpu_m == 2000
    assert sizes["big"].memory_mi == 1504  # 1.5 x 1000 MiB, rounded up to 16 MiB
    assert sizes["big"].memory_limit_mi == 2 * 1504


def test_replicas_grow_with_the_rate() -> None:
    # big at 100 b/s: 100 * 0.1 s = 10 cores / (0.7 * 2) = 7.1 -> 8
    assert capacity.replicas(MEASURED, {"b": 100})["big"] == 8
    # model at 1,000 a/s: 0.5 cores / (0.7 * 0.45) = 1.59 -> 2; the rate of b adds none
    assert capacity.replicas(MEASURED, {"a": 1000, "b": 100})["model"] == 2
    # proxy: 1,000 * 1 ms + 100 * 2 ms = 1.2 cores / (0.7 * 0.9) = 1.9 -> 2
    assert capacity.replicas(MEASURED, {"a": 1000, "b": 100})["proxy"] == 2
    assert capacity.replicas(MEASURED, {"a": 0})["proxy"] == 1  # never none
    with pytest.raises(ValueError, match="'c'"):
        capacity.replicas(MEASURED, {"c": 1})


def test_the_command_prints_a_plan_from_the_measured_file() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "deploy.capacity", "--rate", "digits=2000", "--rate", "ocr=20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line
    ]
    measured = capacity.load()
    plan = capacity.replicas(measured, {"digits": 2000, "ocr": 20})
    assert len(rows) == 1 + len(measured["peak_memory_mib"])
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[-1]) == plan[cells[0]]
    bad = subprocess.run(
        [sys.executable, "-m", "deploy.capacity", "--rate", "digits"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "PIPELINE=REQUESTS_PER_S" in bad.stderr
