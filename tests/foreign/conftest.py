"""Foreign v2 servers for the swap-in and contract tests: started once per session from their
own venvs. In CI they must run (./mesh test makes the venvs); elsewhere, without the venvs,
their tests are skipped with the command that makes them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.foreign import servers
from tests.procs import ROOT

ONNX = ROOT / "models" / "repository" / "digits_mlp" / "1" / "model.onnx"
NAME = "digits"
"""As a user names a digits model, and as the mesh names a pipeline."""


def _need(kind: str) -> None:
    if servers.available(kind):
        return
    message = f"{servers.VENVS[kind].name} is missing (./mesh test makes it)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the foreign-server tests: {message}")
    pytest.skip(message)


def _serve(kind: str, workdir: Path) -> Iterator[servers.Foreign]:
    _need(kind)
    server = servers.start(kind, workdir, NAME, ONNX)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Foreign]:
    yield from _serve("mlserver", tmp_path_factory.mktemp("mlserver"))


@pytest.fixture(scope="session")
def kserve_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Foreign]:
    yield from _serve("kserve", tmp_path_factory.mktemp("kserve"))


@pytest.fixture(params=["mlserver", "kserve"])
def foreign(request: pytest.FixtureRequest) -> servers.Foreign:
    return request.getfixturevalue("mlserver" if request.param == "mlserver" else "kserve_server")
