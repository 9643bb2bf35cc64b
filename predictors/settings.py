"""Settings of the predictor service: flags, or PREDICTOR_* environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import SettingsConfigDict

from protos.cli import with_env_names
from v2server.settings import ControlledSettings

TRITON_FLAGS = {
    "--model-repository": "--repository",
    "--model-store": "--repository",
    "--grpc-port": "--port",
}
"""Triton's flag names, accepted beside ours (--metrics-port is the same in both)."""


@with_env_names
class PredictorSettings(ControlledSettings):
    model_config = SettingsConfigDict(env_prefix="PREDICTOR_", cli_prog_name="python -m predictors")

    port: int = 8001
    """gRPC port; 0 picks a free one (see port_file). Triton's --grpc-port is accepted too."""
    repository: Path = Path("models/repository")
    """The model repository folder: <model>/<version>/model.onnx with <model>/config.yaml or
    Triton's config.pbtxt. Triton's --model-repository (or --model-store) is accepted too."""
    models: str = ""
    """Comma-separated models of the repository to serve; empty serves all."""

    def model_list(self) -> list[str] | None:
        names = [m.strip() for m in self.models.split(",") if m.strip()]
        return names or None
