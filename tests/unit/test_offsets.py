"""The tests' fixed mesh offsets leave every mesh its own ports, all below free_port's picks."""

from __future__ import annotations

import itertools
from pathlib import Path

from compose.local import DEFAULT_FILE
from compose.topology import load
from protos import ports
from tests import offsets


def _ports(offset: int, data: Path) -> set[int]:
    """Every port the shipped topology binds at an offset: *_PORT settings and --port."""
    bound: set[int] = set()
    for service in load([DEFAULT_FILE], environ={}, port_offset=offset, data_dir=data).values():
        bound |= {int(v) for k, v in service.env.items() if k.endswith("_PORT") and v.isdigit()}
        bound |= {int(b) for a, b in itertools.pairwise(service.argv) if a == "--port"}
    return bound


def test_the_topology_ports_are_all_found(tmp_path: Path) -> None:
    # The check below is only as good as this list: the proxy, its door, the preprocess
    # service, six predictors with their metrics, Redis.
    found = _ports(0, tmp_path)
    assert {8080, 8081, 8002, 9002, 8101, 9113, 6380} <= found
    assert len(found) == 17


def test_no_two_meshes_share_a_port_and_none_reaches_free_port_picks(tmp_path: Path) -> None:
    meshes = {name: _ports(offset, tmp_path) for name, offset in offsets.every().items()}
    for (a, ports_a), (b, ports_b) in itertools.combinations(meshes.items(), 2):
        assert not ports_a & ports_b, f"{a} and {b} both bind {sorted(ports_a & ports_b)}"
    for name, bound in meshes.items():
        assert max(bound) < ports.LOWEST, f"{name} binds {max(bound)}, where free_port picks"
        assert min(bound) > 1024, f"{name} binds privileged port {min(bound)}"
