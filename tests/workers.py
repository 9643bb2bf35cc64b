"""How `./mesh test` shares the machine between its two pytest-xdist workers (a pytest
plugin, loaded by `-p tests.workers` in pyproject.toml's addopts).

- Two groups of files, one a worker, each run in order: the files that load both cores
  (SERIAL_FILES) on one, the rest on the other, beside them. A group's fixed ports and its
  shared mesh stay with one process.
- Tests marked `alone` (how the mesh holds under load and faults: budgets, stalls, shedding)
  run last, with the other worker paused: they take a lock that every other test shares,
  so nothing of the other group runs beside them.
Without xdist (`pytest` alone, or `MESH_TEST_WORKERS=0`), tests run one after another."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import pytest

SERIAL_FILES = {
    f"tests/{name}.py"
    for name in (
        "e2e/test_jobs", "e2e/test_batch", "e2e/test_ocr", "e2e/test_digits",
        "e2e/test_client_matrix", "e2e/test_traces", "e2e/test_run_command",
        "e2e/test_swap", "e2e/test_cache", "e2e/test_extending", "e2e/test_workers",
        "e2e/test_balancing", "e2e/test_openapi", "compose/test_docker_compose",
        "proxy/test_cache", "foreign/test_swap_in", "hostile/test_grpc_door",
        "hostile/test_front_door", "hostile/test_services",
        # alone (run last):
        "faults/test_faults", "faults/test_impatient", "faults/test_slow_step",
        "faults/test_stalled_replica", "hostile/test_load",
    )
}  # fmt: skip
"""The CPU-heavy files (the Compose smoke test's containers among them), those with fixed
ports in one range (run_command's and traces' meshes), and the `alone` ones. Besides the
`alone` tests, the two groups take about as long in CI, with the Compose smoke test (on a
slow machine on 2026-12-02: ~805 s and ~780 s; ~370 s of `alone` tests after them): the
other worker must be done by the time the `alone` tests start, or they pause it test by test
and its remaining tests add to the run. Before the smoke test, balancing and OpenAPI files
moved here, the groups had grown to ~470 s and ~1,120 s, and the suite took 1,570 s; in the
clean-clone run right after, 1,342 s."""


def worker_index() -> int:
    """Which of the workers runs this process (0 without xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def group_of(nodeid: str) -> str:
    return "serial" if nodeid.split("::")[0] in SERIAL_FILES else "beside"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's own loadgroup cannot be used: it renames items through an attribute pytest 9
    no longer reads, so its groups are ignored. Its scope scheduler with our two groups as
    the scopes does the same."""
    from xdist.scheduler import LoadScopeScheduling

    class TwoGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return TwoGroups(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `alone` tests last (a stable sort: the same order on every worker, as xdist
    requires): by then the other worker has run its share, so pausing it costs nothing."""
    items.sort(key=lambda item: item.get_closest_marker("alone") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: runs with the other test worker paused (tests/workers.py)"
    )


@contextmanager
def _flock(path: Path, operation: int) -> Generator[None]:
    with path.open("a") as file:
        fcntl.flock(file, operation)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """An `alone` test holds the run's lock exclusively, every other test holds it shared.
    A turnstile in front gives the exclusive side its turn: while an `alone` test waits for
    the other worker's test to end, that worker's next test waits behind it (a shared lock
    could otherwise be taken again at once, test after test)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return (yield)
    lock = Path(tempfile.gettempdir()) / f"mesh-tests-{run}.lock"
    turnstile = lock.with_suffix(".turnstile")
    if item.get_closest_marker("alone") is not None:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(lock, fcntl.LOCK_EX):
            return (yield)
    with _flock(turnstile, fcntl.LOCK_EX):
        pass  # an `alone` test waiting holds it: wait behind it
    with _flock(lock, fcntl.LOCK_SH):
        return (yield)
