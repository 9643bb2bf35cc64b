"""grpc reads GRPC_EXPERIMENTS once, when it is first imported: every process of the mesh
must have protos' setting in its environment by then (protos/__init__.py), or it runs on
grpc's EventEngine after all (twice the context switches a stream message)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import protos
from tests.procs import ROOT

# Prints the variable as grpc's first import begins, then imports the entry point.
WATCH = """
import os, sys
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            print("at grpc:", os.environ.get("GRPC_EXPERIMENTS"), flush=True)
            sys.meta_path.remove(self)
        return None
sys.meta_path.insert(0, Watch())
import {module}
"""


def _grpc_sees(module: str, env: dict[str, str]) -> str:
    """GRPC_EXPERIMENTS as grpc's first import begins in a fresh process importing `module`."""
    done = subprocess.run(
        [sys.executable, "-c", WATCH.format(module=module)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "module",
    [
        "proxy.__main__",
        "proxy.job_worker",
        "predictors.__main__",
        "preprocess.__main__",
        "batch.grpc_door",
    ],
)
def test_every_entry_point_sets_grpcs_environment_before_grpc_loads(module: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    seen = _grpc_sees(module, env)
    assert "at grpc: -event_engine_client,-event_engine_listener\n" in seen, seen


def test_a_deployments_own_setting_wins() -> None:
    seen = _grpc_sees("proxy.__main__", {**os.environ, "GRPC_EXPERIMENTS": "-event_engine_client"})
    assert "at grpc: -event_engine_client\n" in seen, seen


def test_foreign_servers_start_without_the_meshs_setting() -> None:
    """MLServer and KServe's server run in tests as their users run them: not with the grpc
    setting the test process itself picked up from protos; a value the user chose stays."""
    from bench.foreign.servers import foreign_environment

    ours = {"PATH": "/bin", "GRPC_EXPERIMENTS": protos.GRPC_EXPERIMENTS}
    assert foreign_environment(ours) == {"PATH": "/bin"}
    chosen = {"PATH": "/bin", "GRPC_EXPERIMENTS": "-event_engine_client"}
    assert foreign_environment(chosen) == chosen
