"""`python -m proxy [--flags]` (or PROXY_* variables): serve the REST API with uvicorn, and
the v2 gRPC door."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import nullcontext

import uvicorn

from protos import logs, tracing
from protos.cli import settings_from
from protos.tls import TLSConfigError
from proxy import workers
from proxy.app import create_app
from proxy.doors import grpc_front_nginx as nginx
from proxy.doors.protocol import GuardedHttpToolsProtocol
from proxy.doors.server import Server
from proxy.engine import plan
from proxy.errors import DefinitionError
from proxy.settings import ProxySettings
from proxy.transport.target import Target


def main(argv: list[str] | None = None) -> int:
    settings = settings_from(ProxySettings, sys.argv[1:] if argv is None else argv)
    if settings.check:  # before logging is set up: it prints, and touches nothing else
        return _check(settings)
    logs.configure(settings.log_level)
    # The front (nginx on the door's port) is started once: by a supervisor for its workers.
    # Before tracing's exporter opens its gRPC channel: nginx is forked with a preexec_fn, and
    # a fork while grpc's threads run can abort the child before it execs (CI, traces on:
    # "epoll_wait error: Bad file descriptor", nginx exited with -6).
    front = nginx.running if workers.SUPERVISED not in os.environ else nullcontext
    try:
        with front(settings) as settings:
            tracing.setup("proxy")
            if settings.workers > 1:
                return workers.supervise(settings)
            return _serve(settings)
    except nginx.FrontError as exc:
        logging.getLogger("proxy").error("cannot start: %s", exc)
        return 2


def _check(settings: ProxySettings) -> int:
    try:
        plans = plan.load(settings.pipelines, os.environ)
    except DefinitionError as exc:
        print(f"python -m proxy: {exc}", file=sys.stderr)
        return 2
    for name, each in plans.items():
        print(f"{name}:")
        for label, target in each.targets.items():  # in the order the steps call
            print(f"  {label}: {_where(target)}")
            if (rows := each.declared_batches.get(target)) is not None:
                print(f"    up to {rows} rows a call, unless its server says otherwise")
            for kind, other, how in (
                ("canary", each.canaries.get(label), "sent instead to"),
                ("shadow", each.shadows.get(label), "copied to"),
            ):
                if other is not None:
                    print(f"    {kind}: {other.percent:g}% {how} {_where(other.target)}")
    print(f"{settings.pipelines}: {len(plans)} pipelines, every reference and endpoint resolved")
    return 0


def _where(target: Target) -> str:
    version = f" version {target.version}" if target.version else ""
    return f"{target.model}{version} at {target.address} ({target.endpoint})"


def _serve(settings: ProxySettings) -> int:
    try:
        app = create_app(settings, own_process=True)
    except (DefinitionError, TLSConfigError) as exc:
        logging.getLogger("proxy").error("cannot start: %s", exc)
        return 2
    protocol = GuardedHttpToolsProtocol.configured(
        max_head_bytes=int(settings.max_head_kb * 1024),
        max_headers=settings.max_headers,
        head_timeout_s=settings.head_timeout_s,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=protocol,  # type: ignore[arg-type]
        limit_concurrency=settings.max_connections,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    # A worker of several binds the shared port itself (SO_REUSEPORT); uvicorn serves it.
    sockets = (
        [workers.listening_socket(settings.host, settings.port, shared=True)]
        if workers.SUPERVISED in os.environ
        else None
    )
    Server(config).run(sockets=sockets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
