"""Settings every v2 service shares; each service subclasses with its env prefix."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protos.codec import TensorLimits


class ServerSettings(BaseSettings):
    """Flags (`--kebab-case`) with environment equivalents (`<PREFIX>_UPPER_CASE`)."""

    model_config = SettingsConfigDict(
        cli_kebab_case=True,
        cli_implicit_flags=False,
        use_attribute_docstrings=True,
        extra="ignore",
    )

    host: str = "127.0.0.1"
    """Address to bind; 0.0.0.0 inside containers."""
    port: int = 8001
    """gRPC port; 0 picks a free one (see port_file)."""
    metrics_port: int | None = None
    """Prometheus /metrics HTTP port; unset disables it, 0 picks a free one."""
    port_file: Path | None = None
    """Once ready, write {"grpc": port, "metrics": port} as JSON here."""
    grace_s: float = 10.0
    """On SIGTERM, how long in-flight calls may take to finish."""
    shared_memory: bool = False
    """Serve Triton's system shared memory extension. Off unless asked for: a client may then
    have this server map, read and write any POSIX shared memory object (under /dev/shm)
    that the service's user can open."""
    linger_s: float = 1.0
    """After the last answer, how long to keep connections open before exiting: closing a
    socket whose peer is still reading (and acknowledging) resets the connection, and the
    peer loses the end of an answer it had not read yet."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR; JSON lines on stderr."""
    max_message_mb: int = 64
    """Largest gRPC message accepted or sent."""
    max_receive_mb: float | None = None
    """Largest gRPC message accepted, when smaller than max_message_mb (the proxy's gRPC
    door: the REST body limit)."""
    max_connections: int | None = 4096
    """Client connections held at once; more are closed as they arrive (idle HTTP/2
    connections once used up the process's file descriptors). Unset: no limit."""
    max_concurrent_streams: int = 1024
    """Calls and streams one connection may have open at once. With a limit set, gRPC core
    refuses a flood of opened-and-reset streams (HTTP/2 rapid reset) at about the attacker's
    own cost: 150,000 resets cost a service 0.2 s of CPU, not 2.8-4 s, without one."""
    max_connection_idle_s: float | None = 300.0
    """Close a client connection with no call for this long (GOAWAY; clients reconnect on
    their next call). Unset: idle connections stay."""
    handshake_timeout_s: float = 10.0
    """A connection that has not completed its HTTP/2 (and TLS) handshake by then is
    closed."""
    max_tensor_elements: int = 1 << 28
    """Largest element count one tensor may declare."""
    max_inputs: int = 64
    """Most input tensors in one request."""
    stream_window_mb: float = 64.0
    """Bytes of requests one ModelStreamInfer stream may have running or unanswered;
    beyond, the stream is not read until answers go out."""
    max_inflight_mb: float = 1024.0
    """Bytes of requests the whole service may hold; beyond, no request is read (unary or
    streamed) until some are answered, and senders are held back by gRPC's flow control.
    A unary call is read only while there is room for the largest message
    (min(max_receive, this)), then holds its own size; a stream reads its next message, then
    waits for room (one message each beyond the bound: docs/services.md)."""
    max_connection_age_s: float | None = None
    """Close each client connection (GOAWAY) after this long, so that clients look the
    name up again and reach new replicas behind a load-balanced address (a Kubernetes
    ClusterIP Service balances connections, not calls). Unset: connections stay."""
    max_connection_age_grace_s: float = 120.0
    """After max_connection_age_s, how long calls and streams already on the connection
    may go on before it is closed."""
    tls_cert: Path | None = None
    """PEM certificate (chain) to serve TLS with; needs tls_key. Unset: plaintext."""
    tls_key: Path | None = None
    """PEM private key of tls_cert."""
    tls_client_ca: Path | None = None
    """When set, callers must present a certificate this CA signed (mutual TLS)."""

    def max_receive_bytes(self) -> int:
        """The largest message accepted."""
        largest = self.max_message_mb * 2**20
        if self.max_receive_mb is None:
            return largest
        return min(largest, int(self.max_receive_mb * 2**20))

    def tensor_limits(self) -> TensorLimits:
        return TensorLimits(max_elements=self.max_tensor_elements, max_inputs=self.max_inputs)


class ControlledSettings(ServerSettings):
    """A service whose models come from a repository it can read again while it runs
    (v2server/control.py): the predictors' model folders, the preprocess service's recipe
    file."""

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
    def _load_model_is_explicit(self) -> ControlledSettings:
        if self.load_model.strip() and self.model_control_mode != "explicit":
            raise ValueError(
                f"--load-model names the models loaded at start in explicit mode; with "
                f"--model-control-mode {self.model_control_mode} every model is loaded"
            )
        return self

    def model_list(self) -> list[str] | None:
        """The models this service may serve at all; None: every one of its repository."""
        return None

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
