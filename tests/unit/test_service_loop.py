"""Every service serves on uvloop, as the proxy does: on asyncio's own loop a service spent
~10% more CPU a call (bench/README, 2026-11-27, evening)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from v2server import server
from v2server.settings import ServerSettings


def test_a_service_runs_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def serve(_: object) -> None:
        seen.append(asyncio.get_running_loop())

    monkeypatch.setattr(server, "serve", serve)
    monkeypatch.setattr(server, "V2Server", lambda *args, **kwargs: object())
    code = server.run_service(
        object(),  # type: ignore[arg-type]
        ServerSettings(),
        server_name="test",
        server_version="0",
    )
    assert code == 0
    assert len(seen) == 1 and isinstance(seen[0], uvloop.Loop)
