"""Downstream addresses come from environment variables, one per endpoint.

Convention: the pipeline file names a variable (`PREPROCESS_URL`,
`PREDICTOR_DIGITS_LOGREG_URL`, ...) whose value is `host:port`, optionally
followed by `/model` and `/model/version` to point the step at a differently
named model on another v2 server. Changing the variable re-points the step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.errors import DefinitionError

_VALUE = re.compile(
    r"^(?:grpc://)?(?P<host>[A-Za-z0-9_.\-\[\]:]+?):(?P<port>\d{1,5})"
    r"(?:/(?P<model>[^/\s]+)(?:/(?P<version>[^/\s]+))?)?/?$"
)


@dataclass(frozen=True)
class Endpoint:
    variable: str
    address: str
    """host:port of a v2 gRPC server."""
    model: str | None = None
    version: str = ""


@dataclass(frozen=True)
class Target:
    """Where one call goes: the endpoint's variable, its address, the model and version."""

    endpoint: str
    address: str
    model: str
    version: str = ""


def parse(variable: str, value: str) -> Endpoint:
    match = _VALUE.match(value.strip())
    if not match:
        raise DefinitionError(f"{variable}={value!r} is not host:port[/model[/version]]")
    port = int(match["port"])
    if not 0 < port < 65536:
        raise DefinitionError(f"{variable}={value!r}: port out of range")
    return Endpoint(variable, f"{match['host']}:{port}", match["model"], match["version"] or "")


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
