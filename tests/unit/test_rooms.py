"""The proxy's three rooms hold (docs/architecture.md): the doors may use the engine and the
transport, the engine only the transport, the transport neither; all of them the shared
leaves (errors, metrics). Read from the source's imports, so a violation fails here before
it is ever run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.procs import ROOT

PROXY = ROOT / "proxy"
ROOMS = ("doors", "jobs", "engine", "transport")
SHARED = {"proxy.errors", "proxy.metrics"}
"""Leaves every room may import; they import nothing of the proxy."""
TOP_LEVEL = {"__init__", "__main__", "app", "errors", "healthcheck", "metrics", "settings"}
TOP_LEVEL |= {"state", "workers", "job_worker"}
"""The only modules outside the rooms: wiring (app, state, settings, workers, job_worker,
__main__),
the shared leaves, and the container healthcheck."""
MAX_LINES = 300

ALLOWED = {
    "transport": {"proxy.transport"},
    "engine": {"proxy.engine", "proxy.transport"},
    "jobs": {"proxy.jobs", "proxy.engine", "proxy.transport"},
    "doors": {"proxy.doors", "proxy.jobs", "proxy.engine", "proxy.transport", "proxy.state"}
    | {"proxy.settings"},
}


def _modules() -> list[Path]:
    return sorted(PROXY.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every proxy module `path` imports, at any depth of the file (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "proxy" or node.module.startswith("proxy."):
                for alias in node.names:  # `from proxy.x import y`: module y, or a name of x
                    name = f"{node.module}.{alias.name}"
                    found.add(name if _is_module(name) else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("proxy.")}
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; write proxy.<room>.<module>")
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _room(path: Path) -> str | None:
    parts = path.relative_to(PROXY).parts
    return parts[0] if len(parts) > 1 else None


def _within(module: str, allowed: set[str]) -> bool:
    return module in SHARED or any(module == a or module.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_imports_only_what_it_stands_on(room: str) -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _modules()
        if _room(path) == room
        for module in _imports(path)
        if not _within(module, ALLOWED[room])
    }
    assert not wrong, sorted(wrong)


def test_the_shared_leaves_import_nothing_of_the_proxy() -> None:
    for module in SHARED:
        path = PROXY / f"{module.split('.')[1]}.py"
        assert not _imports(path), f"{path}: {_imports(path)}"


def test_nothing_new_lands_beside_the_rooms() -> None:
    """New work goes into a room (or a new one, with this test): the proxy was one flat room
    of 35 modules."""
    loose = {p.stem for p in PROXY.glob("*.py")} - TOP_LEVEL
    assert not loose, f"modules outside the rooms: {sorted(loose)}"
    assert {p.name for p in PROXY.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(ROOMS)


def test_no_proxy_module_is_over_300_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_the_checks_see_a_violation(tmp_path: Path) -> None:
    """The import reader finds every form a shortcut takes: a module from a package, a name
    from a module, a lazy import inside a function."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from proxy.transport import chunks\n"
        "from proxy.errors import Problem\n"
        "def f():\n"
        "    from proxy.doors.rest import budget_s\n"
    )
    assert _imports(sample) == {"proxy.transport.chunks", "proxy.errors", "proxy.doors.rest"}
    assert not _within("proxy.doors.rest", ALLOWED["transport"])
    assert not _within("proxy.engine.plan", ALLOWED["transport"])
    assert not _within("proxy.state", ALLOWED["engine"])
    assert _within("proxy.transport.target", ALLOWED["engine"])
