"""Where one call goes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """Where one call goes: the endpoint's variable, its address, the model and version."""

    endpoint: str
    """The environment variable the address came from (errors and /readyz name it)."""
    address: str
    """host:port of a v2 gRPC server, or a gRPC name for its replicas (dns:///, ipv4:)."""
    model: str
    version: str = ""
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Hashed once: a target keys several lookups of every call (its call spec, its cache
        # key's base), and the generated __hash__ builds a tuple each time.
        identity = (self.endpoint, self.address, self.model, self.version)
        object.__setattr__(self, "_hash", hash(identity))

    def __hash__(self) -> int:
        return self._hash
