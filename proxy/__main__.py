"""`python -m proxy`: serve the REST API with uvicorn (PROXY_HOST / PROXY_PORT)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from protos import logs
from protos.tls import TLSConfigError
from proxy.app import create_app
from proxy.errors import DefinitionError
from proxy.protocol import GuardedHttpToolsProtocol
from proxy.settings import ProxySettings


def main() -> int:
    settings = ProxySettings()
    logs.configure(settings.log_level)
    try:
        app = create_app(settings)
    except (DefinitionError, TLSConfigError) as exc:
        logging.getLogger("proxy").error("cannot start: %s", exc)
        return 2
    protocol = GuardedHttpToolsProtocol.configured(
        max_head_bytes=int(settings.max_head_kb * 1024),
        max_headers=settings.max_headers,
        head_timeout_s=settings.head_timeout_s,
    )
    uvicorn.run(
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
