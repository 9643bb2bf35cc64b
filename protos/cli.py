"""Command lines of the services and the proxy: `--help` describes each flag (the settings
field's docstring) with the environment variable that sets it too."""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic_settings import BaseSettings

S = TypeVar("S", bound=type[BaseSettings])

_ENV_NOTE = re.compile(r"\s*\[env [A-Z0-9_]+\]$")


def with_env_names(cls: S) -> S:
    """Append `[env PREFIX_NAME]` to every field's description (class decorator)."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    for name, field in cls.model_fields.items():
        text = _ENV_NOTE.sub("", field.description or "")
        field.description = f"{text} [env {(prefix + name).upper()}]".strip()
    return cls


def renamed(argv: list[str], aliases: dict[str, str]) -> list[str]:
    """`argv` with other programs' flag names (`--flag value` or `--flag=value`) as ours."""
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        out.append(aliases.get(flag, flag) + eq + value if flag in aliases else arg)
    return out
