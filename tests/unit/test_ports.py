"""free_port picks from below the kernel's ephemeral range, passes over a port in use, and
falls back to the kernel's pick when that range leaves no room."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from protos import ports


def test_a_port_comes_from_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = ports.ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:  # any port: the picks are forced
        used = taken.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        picks = iter([used, used, free])
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(picks))
        assert ports.free_port() == free


def test_a_range_too_low_to_leave_room_falls_back_to_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("1024\t65535\n")
    assert ports.ephemeral_low(tmp_path / "range") == 1024
    assert ports.ephemeral_low(tmp_path / "missing") == 32768
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 1024)
    assert 1024 <= ports.free_port() <= 65535
