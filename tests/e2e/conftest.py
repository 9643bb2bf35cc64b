from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from compose.local import DEFAULT_FILE, LocalMesh
from compose.topology import load

PORT_OFFSET = 20000  # beside a mesh a developer may be running with ./mesh up


@dataclass
class Mesh:
    local: LocalMesh
    url: str
    log: Path

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """The shipped topology (compose/compose.yaml) as real local processes."""
    log = tmp_path_factory.mktemp("mesh") / "mesh.log"
    services = load([DEFAULT_FILE], environ={}, port_offset=PORT_OFFSET)
    with log.open("w") as out:
        local = LocalMesh(services, out=out)
        try:
            local.up(timeout=180)
        except Exception:
            local.down()
            raise RuntimeError(f"mesh did not come up:\n{log.read_text()[-5000:]}") from None
        port = services["proxy"].env["PROXY_PORT"]
        yield Mesh(local, f"http://127.0.0.1:{port}", log)
        local.down()
