"""Read a compose file as the local runner needs it: one process per service.

The translation from containers to local processes is mechanical:
service hostnames and 0.0.0.0 become 127.0.0.1, a mounted volume's container
path becomes the host folder it mounts, `python` becomes this interpreter,
a named volume becomes a folder of its name under the data folder, `--port N` on a
command line moves with the port offset like a `*_PORT` variable, and `${VAR}` /
`${VAR:-default}` are interpolated from the environment as docker compose does.

A service whose program is not installed here (e.g. `redis-server`) is left out when the
caller asks (`./mesh up` needs no server but the mesh's own): the services that depend on it
start without it, and a setting that names it is left unset, so its default applies (the
jobs' queue in SQLite rather than Redis).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
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
    folders: list[Path] = field(default_factory=list)
    """Host folders of its named volumes, made before it starts."""


def installed(program: str) -> bool:
    """Whether a service's program can run here (`python` always can)."""
    return program in ("python", "python3") or shutil.which(program) is not None


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        value = environ.get(match.group("name"))
        if value:
            return value
        return match.group("default") or ""

    return _INTERPOLATION.sub(replace, text)


def merged_specs(files: list[Path]) -> dict:
    """The services of the compose file(s), later files overriding earlier ones, as written
    (variables not interpolated). Services under a profile (one-off tools such as `batch`,
    run by hand with `docker compose run`) are not part of the running topology: left out."""
    merged: dict = {}
    profiled: set[str] = set()
    for path in files:
        data = yaml.safe_load(path.read_text()) or {}
        for name, spec in (data.get("services") or {}).items():
            if (spec or {}).get("profiles"):
                profiled.add(name)
            base = merged.setdefault(name, {})
            for key, value in (spec or {}).items():
                if isinstance(value, dict) and isinstance(base.get(key), dict):
                    base[key] = {**base[key], **value}
                else:
                    base[key] = value
    return {name: spec for name, spec in merged.items() if name not in profiled}


def _as_env(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, list):
        pairs = (item.split("=", 1) for item in raw)
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else str(v) for k, v in dict(raw).items()}  # type: ignore[call-overload]


def _program(spec: dict) -> str:
    command = spec.get("command")
    if not command:
        return ""
    return shlex.split(command)[0] if isinstance(command, str) else str(command[0])


def unavailable(files: list[Path], can_run: Callable[[str], bool] = installed) -> dict[str, str]:
    """Services of the file(s) whose program cannot run here: {service: program}."""
    programs = {name: _program(spec) for name, spec in merged_specs(files).items()}
    return {name: prog for name, prog in programs.items() if prog and not can_run(prog)}


def load(
    files: list[Path],
    environ: Mapping[str, str] | None = None,
    port_offset: int = 0,
    *,
    data_dir: Path | None = None,
    leave_out: set[str] | frozenset[str] = frozenset(),
) -> dict[str, LocalService]:
    """Services of the compose file(s), translated to local processes.

    `port_offset` moves every port (so a second mesh can run beside `./mesh up`);
    `data_dir` holds the named volumes (default: data/ beside the compose folder);
    `leave_out` names services not to run: a setting naming one of them is left unset.
    """
    environ = os.environ if environ is None else environ
    specs = merged_specs(files)
    if not specs:
        raise TopologyError(f"{files[0]}: no services")
    base_dir = files[0].parent
    data_dir = data_dir or base_dir.parent / "data"
    hostnames = sorted(specs, key=len, reverse=True)
    host_re = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, hostnames)) + r"):(\d+)")
    absent = re.compile(
        r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(leave_out))) + r"):\d+"
        if leave_out
        else r"(?!)"
    )

    services: dict[str, LocalService] = {}
    for name, spec in specs.items():
        if name in leave_out:
            continue
        mounts: list[tuple[str, str]] = []
        folders: list[Path] = []
        for volume in spec.get("volumes") or []:
            if isinstance(volume, str) and ":" in volume:
                host, container = volume.split(":")[:2]
                if host.startswith((".", "/", "~")):
                    source = (base_dir / host).resolve()
                else:  # a named volume: a folder of ours
                    source = (data_dir / host).resolve()
                    folders.append(source)
                mounts.append((container.rstrip("/"), str(source)))

        def local(value: str, mounts: list[tuple[str, str]] = mounts) -> str:
            value = interpolate(value, environ)
            if absent.search(value):
                return ""
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
        argv = [
            str(int(a) + port_offset) if i and argv[i - 1] == "--port" and a.isdigit() else a
            for i, a in enumerate(argv)
        ]
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
        depends = [d for d in spec.get("depends_on") or [] if d not in leave_out]
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
            folders=folders,
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
