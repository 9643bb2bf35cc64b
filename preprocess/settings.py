"""Settings of the preprocess service: flags, or PREPROCESS_* environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import SettingsConfigDict

from protos.cli import with_env_names
from v2server.settings import ControlledSettings

DEFAULT_RECIPES = Path(__file__).resolve().parent / "recipes.yaml"


@with_env_names
class PreprocessSettings(ControlledSettings):
    model_config = SettingsConfigDict(
        env_prefix="PREPROCESS_", cli_prog_name="python -m preprocess"
    )

    port: int = 8002
    """gRPC port; 0 picks a free one (see port_file)."""
    config: Path = DEFAULT_RECIPES
    """The recipe file: the service's repository, each recipe a model (model control reads it
    again while the service runs: --model-control-mode)."""
    workers: int = 2
    """Threads running recipes (OpenCV itself runs single-threaded in each)."""
    inline_below_ms: float = 2.0
    """Recipes averaging less than this, on uploads under 64 KiB whose images take under
    1 MiB decoded (read from their headers), run on the event loop.
    At low load every run is cold (the 0.1 ms `digits_input` recipe takes 0.5-1 ms after a few
    idle milliseconds on a 2-core VM) and a hand-off to a worker thread costs ~0.5 ms more
    (A/B at c=1: digits pipeline p50 -0.4 ms against 0.5 here)."""
    max_queue_size: int = 256
    """Requests per recipe that may wait for a worker; more get RESOURCE_EXHAUSTED."""
