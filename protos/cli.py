"""Command lines of the services and the proxy: `--help` describes each flag (the settings
field's docstring) with the environment variable that sets it too."""

from __future__ import annotations

import re
import sys
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=type[BaseSettings])
B = TypeVar("B", bound=BaseSettings)

_ENV_NOTE = re.compile(r"\s*\[env [A-Z0-9_]+\]$")
_CREDENTIALS = re.compile(r"(?<=://)[^/?#@\s]+@")
"""The `user:password@` of an address (`redis://:secret@host`), left out of what is printed:
a start-up error's lines reach logs that others read."""


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


def joined(argv: list[str], flag: str) -> list[str]:
    """`argv` with every `--flag value` (or `--flag=value`) given as one `--flag v1,v2`, as
    Triton takes a repeated `--load-model`; a setting read once would keep the last alone."""
    values, rest, args = [], [], iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name != flag:
            rest.append(arg)
        elif eq:
            values.append(value)
        else:
            values.append(next(args, ""))
    return [*rest, flag, ",".join(values)] if values else rest


def settings_from(cls: type[B], argv: list[str], **kwargs: Any) -> B:
    """The settings of a command line and the environment; on a value that does not fit, each
    problem on stderr, naming the flag and its variable, and exit status 2 (a typo in a
    variable was a 30-line traceback)."""
    try:
        return cls(_cli_parse_args=argv, **kwargs)
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            message = _hidden(error["msg"].removeprefix("Value error, "))
            if not field:  # a check across settings: its message names them
                print(f"invalid settings: {message}", file=sys.stderr)
                continue
            flag, variable = f"--{field.replace('_', '-')}", (prefix + field).upper()
            given = f" (given {_hidden(repr(error['input']))})" if "input" in error else ""
            print(f"invalid setting {flag} ({variable}): {message}{given}", file=sys.stderr)
        raise SystemExit(2) from None


def _hidden(text: str) -> str:
    return _CREDENTIALS.sub("***@", text)
