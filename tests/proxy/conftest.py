from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import yaml

from proxy.app import create_app
from proxy.settings import ProxySettings
from tests.proxy.scripted import ScriptedModel, serve


@pytest.fixture(params=["stream", "unary"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every proxy test runs on both paths: streams with merged calls, and the old path
    (unary calls, no merging)."""
    return request.param


@pytest.fixture
def make_client(tmp_path: Path, transport: str) -> Callable[..., AsyncIterator[httpx.AsyncClient]]:
    """An in-process proxy (ASGITransport) for a pipelines dict and an environment."""

    def factory(pipelines: dict, env: dict[str, str], **settings):
        path = tmp_path / "pipelines.yaml"
        path.write_text(yaml.safe_dump({"pipelines": pipelines}))
        settings.setdefault("transport", transport)
        settings.setdefault("merge", transport == "stream")  # "unary": the old path
        app = create_app(ProxySettings(pipelines=path, **settings), env)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")

    return factory


@pytest.fixture
async def servers():
    started = []

    async def start(*models: ScriptedModel):
        server = await serve(*models)
        started.append(server)
        return f"127.0.0.1:{server.port}"

    yield start
    for server in started:
        await server.stop(0)
