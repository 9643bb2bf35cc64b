"""`python -m predictors --repository DIR --port P` (or PREDICTOR_* variables)."""

from __future__ import annotations

import asyncio
import logging
import sys

from predictors import __version__
from predictors.config import ConfigError
from predictors.repository import OnnxRepository
from predictors.settings import PredictorSettings
from v2server import logs
from v2server.server import V2Server, serve


def main(argv: list[str] | None = None) -> int:
    settings = PredictorSettings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    logs.configure(settings.log_level)
    repository = OnnxRepository(settings.repository, settings.model_list())
    server = V2Server(
        repository, settings, server_name="inference-mesh-predictor", server_version=__version__
    )
    try:
        asyncio.run(serve(server))
    except ConfigError as exc:
        logging.getLogger("predictors").error("cannot start: %s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
