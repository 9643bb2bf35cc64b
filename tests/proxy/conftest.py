from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from proxy.app import create_app
from proxy.settings import ProxySettings
from tests.conftest import redis_or_skip
from tests.proxy.scripted import ScriptedModel, serve

GENEROUS_CACHE_MS = 2000
"""cache_timeout_ms (and ready_timeout_ms) for tests of what is cached: a store call slower
than its timeout counts as a miss, a service slower than ready_timeout_ms to tell its model's
metadata (its keys' fingerprint) leaves the request uncached, and the suite loads the CPU (a
50 ms Redis write was once dropped, and a first request once went uncached, in CI runs)."""


@pytest.fixture(params=["sqlite", "redis"])
def jobs_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each test on both backends: an SQLite file; a redis-server of its own, persistent."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
        return
    server = redis_or_skip(tmp_path / "redis", persistent=True)
    yield server.url
    server.stop()


@pytest.fixture(params=["stream", "unary"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every proxy test runs on both paths: streams with merged calls, and the old path
    (unary calls, no merging)."""
    return request.param


@pytest.fixture
def make_client(tmp_path: Path, transport: str) -> Callable[..., AsyncIterator[httpx.AsyncClient]]:
    """An in-process proxy (ASGITransport) for a pipelines dict and an environment."""

    @contextlib.asynccontextmanager
    async def factory(
        pipelines: dict, env: dict[str, str], **settings
    ) -> AsyncIterator[httpx.AsyncClient]:
        path = tmp_path / "pipelines.yaml"
        path.write_text(yaml.safe_dump({"pipelines": pipelines}))
        settings.setdefault("transport", transport)
        settings.setdefault("merge", transport == "stream")  # "unary": the old path
        settings.setdefault("grpc_port", None)  # the gRPC door's tests start their own
        settings.setdefault("jobs_workers", 0)  # the jobs' tests run workers
        settings.setdefault("jobs_url", f"sqlite:///{tmp_path / 'jobs.sqlite3'}")
        app = create_app(ProxySettings(pipelines=path, **settings), env)
        # Its lifespan run as a server runs it: what it opens (channels, caches) is closed.
        async with app.router.lifespan_context(app):
            transport_ = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport_, base_url="http://proxy") as client:
                yield client

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
