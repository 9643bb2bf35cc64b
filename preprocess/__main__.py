"""`python -m preprocess --config FILE --port P` (or PREPROCESS_* variables)."""

from __future__ import annotations

import sys

import cv2

from preprocess.repository import RecipeRepository
from preprocess.settings import PreprocessSettings
from protos import logs, tracing
from protos.cli import joined, settings_from
from protos.version import VERSION
from v2server.control import ModelControl
from v2server.server import run_service


def main(argv: list[str] | None = None) -> int:
    settings = settings_from(
        PreprocessSettings, joined(sys.argv[1:] if argv is None else argv, "--load-model")
    )
    logs.configure(settings.log_level)
    tracing.setup("preprocess")
    cv2.setNumThreads(1)  # parallelism comes from the worker threads
    repository = RecipeRepository(
        settings.config, settings.workers, settings.max_queue_size, settings.inline_below_ms
    )
    models = repository.registry(settings.loaded_at_start())
    control = ModelControl(
        models,
        repository,
        settings.model_control_mode,
        poll_s=settings.repository_poll_secs,
        grace_s=settings.grace_s,
    )
    return run_service(
        models,
        settings,
        server_name="inference-mesh-preprocess",
        server_version=VERSION,
        control=control,
    )


if __name__ == "__main__":
    sys.exit(main())
