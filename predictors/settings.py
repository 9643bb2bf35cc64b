"""Settings of the predictor service: flags, or PREDICTOR_* environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import SettingsConfigDict

from v2server.settings import ServerSettings


class PredictorSettings(ServerSettings):
    model_config = SettingsConfigDict(env_prefix="PREDICTOR_", cli_prog_name="python -m predictors")

    repository: Path = Path("models/repository")
    """The model repository folder (<model>/config.yaml, <model>/<version>/model.onnx)."""
    models: str = ""
    """Comma-separated models of the repository to serve; empty serves all."""

    def model_list(self) -> list[str] | None:
        names = [m.strip() for m in self.models.split(",") if m.strip()]
        return names or None
