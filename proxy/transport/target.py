"""Where one call goes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """Where one call goes: the endpoint's variable, its address, the model and version."""

    endpoint: str
    """The environment variable the address came from (errors and /readyz name it)."""
    address: str
    """host:port of a v2 gRPC server, or a gRPC name for its replicas (dns:///, ipv4:)."""
    model: str
    version: str = ""

    def __post_init__(self) -> None:
        # Hashed once: a target keys several lookups of every call (its call spec, its cache
        # key's base), and the generated __hash__ builds a tuple each time. Not a field:
        # asdict() (GET /v1/pipelines) shows the fields.
        identity = (self.endpoint, self.address, self.model, self.version)
        object.__setattr__(self, "_hash", hash(identity))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __getstate__(self) -> dict[str, str]:
        # Without the hash: another process hashes strings with another seed.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__dict__.update(state)
        self.__post_init__()
