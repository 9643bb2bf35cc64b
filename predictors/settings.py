"""Settings of the predictor service: flags, or PREDICTOR_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from protos.cli import with_env_names
from v2server.settings import ServerSettings

TRITON_FLAGS = {
    "--model-repository": "--repository",
    "--model-store": "--repository",
    "--grpc-port": "--port",
}
"""Triton's flag names, accepted beside ours (--metrics-port is the same in both)."""


@with_env_names
class PredictorSettings(ServerSettings):
    model_config = SettingsConfigDict(env_prefix="PREDICTOR_", cli_prog_name="python -m predictors")

    port: int = 8001
    """gRPC port; 0 picks a free one (see port_file). Triton's --grpc-port is accepted too."""
    repository: Path = Path("models/repository")
    """The model repository folder: <model>/<version>/model.onnx with <model>/config.yaml or
    Triton's config.pbtxt. Triton's --model-repository (or --model-store) is accepted too."""
    models: str = ""
    """Comma-separated models of the repository to serve; empty serves all."""
    model_control_mode: Literal["none", "explicit", "poll"] = "none"
    """As Triton's: `none`, the models loaded at start until the service stops; `explicit`,
    models loaded, reloaded and unloaded by RepositoryModelLoad / RepositoryModelUnload
    (tritonclient's load_model, unload_model), those of --load-model at start; `poll`, the
    repository read again every --repository-poll-secs (changed models reloaded, new ones
    loaded, removed ones unloaded). A reload fails no request (docs/services.md)."""
    repository_poll_secs: float = Field(default=15.0, gt=0)
    """How often `poll` mode reads the repository again."""
    load_model: str = ""
    """`explicit` mode: the models loaded at start, comma-separated or the flag repeated as
    Triton takes it (`*`: every one); none if empty."""

    @model_validator(mode="after")
    def _load_model_is_explicit(self) -> PredictorSettings:
        if self.load_model.strip() and self.model_control_mode != "explicit":
            raise ValueError(
                f"--load-model names the models loaded at start in explicit mode; with "
                f"--model-control-mode {self.model_control_mode} every model is loaded"
            )
        return self

    def model_list(self) -> list[str] | None:
        names = [m.strip() for m in self.models.split(",") if m.strip()]
        return names or None

    def loaded_at_start(self) -> list[str] | None:
        """The models loaded at start: those of --load-model in explicit mode (None: all
        those served)."""
        if self.model_control_mode != "explicit":
            return self.model_list()
        named = [m.strip() for m in self.load_model.split(",") if m.strip()]
        if "*" in named:
            return self.model_list()
        served = self.model_list()
        return [m for m in named if served is None or m in served]
