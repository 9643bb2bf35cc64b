"""`python -m proxy.job_worker` (the same PROXY_* settings as the proxy): a worker-only
process that runs jobs from the queue (PROXY_JOBS_URL) with the proxy's engine, and serves
/healthz, /readyz and /metrics on PROXY_PORT, nothing else. It scales on its own (a
Deployment of its own on Kubernetes); the proxies beside it may run none
(PROXY_JOBS_WORKERS=0 there). SIGTERM hands its running jobs back to the queue."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from protos import heap, logs
from protos.cli import settings_from
from protos.tls import TLSConfigError
from proxy.app import NO_FASTAPI_TELEMETRY
from proxy.doors.health import HealthEndpoints
from proxy.doors.server import Server
from proxy.errors import DefinitionError
from proxy.settings import ProxySettings
from proxy.state import ProxyState

log = logging.getLogger("proxy")


def create_worker_app(settings: ProxySettings) -> FastAPI:
    state = ProxyState.build(settings)
    if settings.jobs_workers < 1:
        raise DefinitionError("a job worker needs PROXY_JOBS_WORKERS of 1 or more")
    health = HealthEndpoints(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.jobs.start()
        log.info(
            "job worker running",
            extra={"fields": {"queue": state.jobs.address, "workers": settings.jobs_workers}},
        )
        heap.settle()
        yield
        await state.jobs.stop()
        await state.engine.close()
        await state.channels.close()

    app = FastAPI(
        title="inference-mesh job worker",
        lifespan=lifespan,
        openapi_url=None,
        telemetry=NO_FASTAPI_TELEMETRY,
    )
    app.add_api_route("/healthz", health.live, methods=["GET"])
    app.add_api_route("/readyz", health.ready, methods=["GET"])
    app.add_api_route("/metrics", health.metrics, methods=["GET"])
    return app


def main(argv: list[str] | None = None) -> int:
    settings = settings_from(
        ProxySettings,
        sys.argv[1:] if argv is None else argv,
        _cli_prog_name="python -m proxy.job_worker",
    )
    logs.configure(settings.log_level)
    try:
        app = create_worker_app(settings)
    except (DefinitionError, TLSConfigError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
