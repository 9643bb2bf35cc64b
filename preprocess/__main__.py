"""`python -m preprocess --config FILE --port P` (or PREPROCESS_* variables)."""

from __future__ import annotations

import sys

import cv2

from preprocess import recipes
from preprocess.settings import PreprocessSettings
from protos import logs, tracing
from protos.cli import settings_from
from protos.version import VERSION
from v2server.server import run_service


def main(argv: list[str] | None = None) -> int:
    settings = settings_from(PreprocessSettings, sys.argv[1:] if argv is None else argv)
    logs.configure(settings.log_level)
    tracing.setup("preprocess")
    cv2.setNumThreads(1)  # parallelism comes from the worker threads
    return run_service(
        recipes.registry(
            settings.config, settings.workers, settings.max_queue_size, settings.inline_below_ms
        ),
        settings,
        server_name="inference-mesh-preprocess",
        server_version=VERSION,
    )


if __name__ == "__main__":
    sys.exit(main())
