"""Downstream addresses come from environment variables, one per endpoint.

Convention: the pipeline file names a variable (`PREPROCESS_URL`,
`PREDICTOR_DIGITS_LOGREG_URL`, ...) whose value is `host:port`, optionally
followed by `/model` and `/model/version` to point the step at a differently
named model on another v2 server. Changing the variable re-points the step.
Replicas of a service: `dns:///name:port` (e.g. a Kubernetes headless Service) or
`ipv4:host:port,host:port`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.errors import DefinitionError

_ADDRESS = re.compile(
    r"^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+?):(?P<port>\d{1,5})$"
)
_SCHEMES = ("dns:", "ipv4:", "ipv6:")
"""gRPC's name syntax for a service with several replicas: `dns:///name:port` (every address
the name resolves to) or `ipv4:a:port,b:port` (a list). proxy/transport/balancing.py spreads the
calls over them."""


@dataclass(frozen=True)
class Endpoint:
    variable: str
    address: str
    """host:port of a v2 gRPC server, or a gRPC name for its replicas (dns:///, ipv4:)."""
    model: str | None = None
    version: str = ""


def parse(variable: str, value: str) -> Endpoint:
    text = value.strip().removeprefix("grpc://")
    scheme = next((s for s in _SCHEMES if text.startswith(s)), "")
    rest = text[len(scheme) :]
    if scheme == "dns:":
        if rest.startswith("//") and not rest.startswith("///"):
            raise DefinitionError(
                f"{variable}={value!r}: a DNS server in the name (dns://server/) is not "
                "supported; write dns:///name:port"
            )
        rest = rest.removeprefix("///")
    addresses, _, path = rest.partition("/")
    model, _, version = path.rstrip("/").partition("/")
    listed = addresses.split(",")
    if "/" in version or (len(listed) > 1 and scheme not in ("ipv4:", "ipv6:")):
        raise DefinitionError(_expected(variable, value))
    for address in listed:
        match = _ADDRESS.match(address)
        if not match:
            raise DefinitionError(_expected(variable, value))
        if not 0 < int(match["port"]) < 65536:
            raise DefinitionError(f"{variable}={value!r}: port out of range")
    named = "dns:///" if scheme == "dns:" else scheme
    return Endpoint(variable, named + ",".join(listed), model or None, version)


def _expected(variable: str, value: str) -> str:
    return (
        f"{variable}={value!r} is not host:port[/model[/version]] "
        "(or dns:///name:port, ipv4:host:port,host:port... for replicas)"
    )


def resolve(variable: str, environ: Mapping[str, str]) -> Endpoint:
    value = environ.get(variable)
    if not value:
        raise DefinitionError(f"endpoint variable {variable} is not set (expected host:port)")
    return parse(variable, value)


def with_prefix(prefix: str, environ: Mapping[str, str]) -> dict[str, Endpoint]:
    """Every `<prefix><BRANCH>_URL` variable, keyed by the branch name in lower case."""
    found = {}
    for variable in sorted(environ):
        if variable.startswith(prefix) and variable.endswith("_URL"):
            branch = variable[len(prefix) : -len("_URL")].lower()
            if branch:
                found[branch] = parse(variable, environ[variable])
    return found


SHADOW = "_SHADOW"
"""`<VARIABLE>_SHADOW`: where a copy of the endpoint's calls goes (proxy/engine/shadows.py);
`<VARIABLE>_SHADOW_PERCENT` (default 100): how many of them."""
CANARY = "_CANARY"
"""`<VARIABLE>_CANARY`: where a share of the endpoint's calls goes instead
(proxy/engine/canaries.py); `<VARIABLE>_CANARY_PERCENT` (required): how many of them.
Neither suffix ends in `_URL`, so a parallel step's `branches_from` never takes one for a
branch."""


MAX_BATCH = "_MAX_BATCH_SIZE"
"""`<VARIABLE>_MAX_BATCH_SIZE`: the rows the endpoint's model takes in one call, for a server
that cannot say so itself (no ModelConfig: MLServer, KServe's model server), so that the
proxy merges concurrent requests' calls to it and sends large requests in chunks of that
many rows, as it does for a model whose server reports its max_batch_size. A server that
reports one is taken at its word."""
MAX_DECLARED_BATCH = 1 << 16


def declared_batch(variable: str, environ: Mapping[str, str]) -> int | None:
    """The rows `<variable>_MAX_BATCH_SIZE` declares, if it is set."""
    named = variable + MAX_BATCH
    text = environ.get(named, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) <= MAX_DECLARED_BATCH:
        raise DefinitionError(
            f"{named}={text!r}: expected the rows the model takes in one call, a whole number "
            f"from 1 to {MAX_DECLARED_BATCH}"
        )
    return int(text)


def alternate(
    variable: str, suffix: str, environ: Mapping[str, str], default_percent: float | None
) -> tuple[Endpoint, float] | None:
    """The endpoint `<variable><suffix>` and the percent of calls it takes
    (`<variable><suffix>_PERCENT`, or `default_percent`), if one is set."""
    value = environ.get(variable + suffix)
    if not value:
        return None
    named = variable + suffix + "_PERCENT"
    text = environ.get(named)
    if text is not None:
        percent = _percent(named, text)
    elif default_percent is not None:
        percent = default_percent
    else:
        raise DefinitionError(
            f"{variable + suffix} is set but {named} is not: say which percent of the calls "
            "it takes (above 0 up to 100)"
        )
    return parse(variable + suffix, value), percent


def _percent(variable: str, text: str) -> float:
    try:
        percent = float(text)
    except ValueError:
        percent = float("nan")
    if not 0 < percent <= 100:  # NaN fails this too
        raise DefinitionError(
            f"{variable}={text!r}: expected a percent of calls, above 0 up to 100"
        )
    return percent
