"""Settings of the proxy: PROXY_* environment variables (endpoints have their own)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PIPELINES = Path(__file__).resolve().parent / "pipelines.yaml"


class ProxySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PROXY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8080
    pipelines: Path = DEFAULT_PIPELINES
    """The pipeline definition file."""
    max_body_mb: float = 20.0
    """Largest request body; larger ones get 413."""
    max_timeout_ms: float = 60_000
    """Cap on X-Request-Timeout-Ms."""
    max_in_flight: int = 512
    """Pipeline requests served at once; more get 503 with Retry-After."""
    ready_timeout_ms: float = 1000
    """Per-endpoint timeout of the /readyz checks."""
    api_key: str | None = None
    """When set, requests need `Authorization: Bearer <key>` or `X-API-Key: <key>`."""
    open_paths: str = "/healthz,/readyz,/metrics"
    """Paths served without the API key."""
    max_message_mb: int = 64
    tls_ca: Path | None = None
    """PEM CA that signed the services' certificates: calls them over TLS. Unset: plaintext."""
    tls_cert: Path | None = None
    """PEM client certificate for services that require one (mutual TLS); needs tls_key."""
    tls_key: Path | None = None
    log_level: str = "INFO"
