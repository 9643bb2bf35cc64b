from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import yaml

from proxy.app import create_app
from proxy.settings import ProxySettings


@pytest.fixture
def make_client(tmp_path: Path) -> Callable[..., AsyncIterator[httpx.AsyncClient]]:
    """An in-process proxy (ASGITransport) for a pipelines dict and an environment."""

    def factory(pipelines: dict, env: dict[str, str], **settings):
        path = tmp_path / "pipelines.yaml"
        path.write_text(yaml.safe_dump({"pipelines": pipelines}))
        app = create_app(ProxySettings(pipelines=path, **settings), env)
        transport = httpx.ASGITransport(app=app)
        return httpx.AsyncClient(transport=transport, base_url="http://proxy")

    return factory
