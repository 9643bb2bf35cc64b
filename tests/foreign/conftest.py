"""The foreign v2 servers (fixtures `mlserver`, `kserve_server` in tests/conftest.py, shared
with the contract suite), one test per server."""

from __future__ import annotations

import pytest

from bench.foreign import servers


@pytest.fixture(params=["mlserver", "kserve"])
def foreign(request: pytest.FixtureRequest) -> servers.Foreign:
    return request.getfixturevalue("mlserver" if request.param == "mlserver" else "kserve_server")
