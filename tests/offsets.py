"""Where the tests' whole meshes sit: the shipped topology's ports (6,380-9,113) each moved by
one fixed offset. pytest-xdist runs these meshes side by side, so no two may share a port
(a CI run lost its run-command mesh when the traced mesh, 1,000 higher, held 31,103), and
every port stays below protos.ports.LOWEST, where free_port picks ports for other tests'
servers. tests/unit/test_offsets.py checks both."""

from __future__ import annotations


def session_mesh(worker: int) -> int:
    """Each pytest-xdist worker's shared mesh, beside a developer's `./mesh up` (offset 0)."""
    return 20000 - 6000 * worker


RUN_COMMAND = 16000
"""tests/e2e/test_run_command.py: the README's run command, shipped settings and Redis."""
TRACES = 18500
"""tests/e2e/test_traces.py: the topology exporting its spans to one receiver."""
WORKERS = 2
"""The suite's pytest-xdist workers in CI (`-n 2`)."""


def every() -> dict[str, int]:
    """Every fixed mesh offset the suite may run at once, by name."""
    named = {f"session mesh of gw{w}": session_mesh(w) for w in range(WORKERS)}
    return {**named, "run command": RUN_COMMAND, "traces": TRACES}
