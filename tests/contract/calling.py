"""Clients that call a service without a pause while a test changes it under them (model
control's reloads), and waiting for what a change should bring."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import grpc
import httpx
import yaml

from proxy.app import create_app
from proxy.settings import ProxySettings

T = TypeVar("T")


@dataclass
class Calls(Generic[T]):
    answers: list[T] = field(default_factory=list)
    """In the order they came back."""
    errors: list[grpc.RpcError] = field(default_factory=list)


@contextmanager
def calling(call: Callable[[], T], clients: int = 4) -> Iterator[Calls[T]]:
    """`clients` threads calling `call` again and again until the block ends."""
    calls: Calls[T] = Calls()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                calls.answers.append(call())
            except grpc.RpcError as exc:
                calls.errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield calls
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def until(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait for `done` (a poll of the repository is due every 0.2 s in these tests)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not within the time given"
        time.sleep(0.05)


@asynccontextmanager
async def proxy_over(
    tmp_path: Path, name: str, pipeline: dict, env: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an in-process proxy serving `pipeline` over the services of `env`, asking
    their models' metadata again every 0.2 s (PROXY_CACHE_CHECK_MS)."""
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump({"pipelines": {name: pipeline}}))
    settings = ProxySettings(
        pipelines=path,
        grpc_port=None,
        jobs_workers=0,
        jobs_url=f"sqlite:///{tmp_path / 'jobs.sqlite3'}",
        cache_check_ms=200,
    )
    app = create_app(settings, env)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            yield client
