"""Read a compose file as the local runner needs it: one process per service.

The translation from containers to local processes is mechanical:
service hostnames and 0.0.0.0 become 127.0.0.1, a mounted volume's container
path becomes the host folder it mounts, `python` becomes this interpreter,
and `${VAR}` / `${VAR:-default}` are interpolated from the environment as
docker compose does.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}")


class TopologyError(ValueError):
    """The compose file cannot be run locally; the message says why."""


@dataclass
class LocalService:
    name: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str] | None = None
    depends_on: list[str] = field(default_factory=list)
    restart: str = "no"
    """Compose restart policy: no, always, on-failure or unless-stopped."""


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        value = environ.get(match.group("name"))
        if value:
            return value
        return match.group("default") or ""

    return _INTERPOLATION.sub(replace, text)


def merged_specs(files: list[Path]) -> dict:
    """The services of the compose file(s), later files overriding earlier ones, as written
    (variables not interpolated)."""
    merged: dict = {}
    for path in files:
        data = yaml.safe_load(path.read_text()) or {}
        for name, spec in (data.get("services") or {}).items():
            base = merged.setdefault(name, {})
            for key, value in (spec or {}).items():
                if isinstance(value, dict) and isinstance(base.get(key), dict):
                    base[key] = {**base[key], **value}
                else:
                    base[key] = value
    return merged


def _as_env(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, list):
        pairs = (item.split("=", 1) for item in raw)
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else str(v) for k, v in dict(raw).items()}  # type: ignore[call-overload]


def load(
    files: list[Path], environ: Mapping[str, str] | None = None, port_offset: int = 0
) -> dict[str, LocalService]:
    """Services of the compose file(s), translated to local processes.

    `port_offset` moves every port (so a second mesh can run beside `./mesh up`).
    """
    environ = os.environ if environ is None else environ
    specs = merged_specs(files)
    if not specs:
        raise TopologyError(f"{files[0]}: no services")
    base_dir = files[0].parent
    hostnames = sorted(specs, key=len, reverse=True)
    host_re = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, hostnames)) + r"):(\d+)")

    services: dict[str, LocalService] = {}
    for name, spec in specs.items():
        mounts: list[tuple[str, str]] = []
        for volume in spec.get("volumes") or []:
            if isinstance(volume, str) and ":" in volume:
                host, container = volume.split(":")[:2]
                mounts.append((container.rstrip("/"), str((base_dir / host).resolve())))

        def local(value: str, mounts: list[tuple[str, str]] = mounts) -> str:
            value = interpolate(value, environ)
            value = host_re.sub(lambda m: f"127.0.0.1:{int(m.group(2)) + port_offset}", value)
            value = value.replace("0.0.0.0", "127.0.0.1")
            for container, host in mounts:
                value = re.sub(rf"(?<![\w/]){re.escape(container)}(?=/|$|\s|:)", host, value)
            return value

        command = spec.get("command")
        if command is None:
            raise TopologyError(f"service '{name}' has no command")
        argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        argv = [local(a) for a in argv]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        test = (spec.get("healthcheck") or {}).get("test")
        check = None
        if isinstance(test, list) and test and test[0] in ("CMD", "CMD-SHELL"):
            check = (
                [local(t) for t in test[1:]] if test[0] == "CMD" else ["sh", "-c", local(test[1])]
            )
            if check[0] in ("python", "python3"):
                check[0] = sys.executable
        depends = spec.get("depends_on") or []
        services[name] = LocalService(
            name=name,
            argv=argv,
            env={
                k: str(int(v) + port_offset) if k.endswith("_PORT") and v.isdigit() else local(v)
                for k, v in _as_env(spec.get("environment")).items()
            },
            healthcheck=check,
            depends_on=list(depends),
            restart=str(spec.get("restart", "no")),
        )
    for svc in services.values():
        unknown = [d for d in svc.depends_on if d not in services]
        if unknown:
            raise TopologyError(f"service '{svc.name}' depends on unknown {unknown}")
    return services


def start_order(services: Mapping[str, LocalService]) -> list[str]:
    """Dependencies first; raises on a cycle."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise TopologyError(f"dependency cycle: {' -> '.join((*path, name))}")
        state[name] = "visiting"
        for dep in services[name].depends_on:
            visit(dep, (*path, name))
        state[name] = "done"
        order.append(name)

    for name in services:
        visit(name, ())
    return order
