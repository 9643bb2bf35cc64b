"""`python -m predictors --repository DIR --port P` (or PREDICTOR_* variables)."""

from __future__ import annotations

import sys

from predictors import repository
from predictors.settings import TRITON_FLAGS, PredictorSettings
from protos import logs, tracing
from protos.cli import joined, renamed, settings_from
from protos.version import VERSION
from v2server.control import ModelControl
from v2server.server import run_service


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings = settings_from(PredictorSettings, joined(renamed(args, TRITON_FLAGS), "--load-model"))
    logs.configure(settings.log_level)
    tracing.setup("predictor")
    models = repository.registry(settings.repository, settings.loaded_at_start())
    control = ModelControl(
        models,
        repository.OnnxRepository(settings.repository, settings.model_list()),
        settings.model_control_mode,
        poll_s=settings.repository_poll_secs,
        grace_s=settings.grace_s,
    )
    return run_service(
        models,
        settings,
        server_name="inference-mesh-predictor",
        server_version=VERSION,
        control=control,
    )


if __name__ == "__main__":
    sys.exit(main())
