"""Every model version a service hosts, by name and version: one registry for all services."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Executor

from protos.errors import NotFound, Unavailable
from v2server.model import Served

log = logging.getLogger("v2server")

Loader = Callable[[], Iterable[Served]]


def _version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)


class Registry:
    """Loads what `load` returns (in a thread: loading reads files and builds sessions),
    starts every version, and resolves names and versions with errors that name what
    is there. `executor`, if given, is shut down after the models stop (a pool the
    models share)."""

    def __init__(self, load: Loader, *, noun: str = "model", executor: Executor | None = None):
        self._load = load
        self.noun = noun
        self._executor = executor
        self._models: dict[str, dict[str, Served]] = {}
        self._newest: dict[str, Served] = {}
        self._ready = False
        self._loaded = False

    @classmethod
    def of(cls, *models: Served, noun: str = "model") -> Registry:
        """A registry of models already built (tests, embedding, the proxy's pipelines):
        they resolve at once; start() starts them."""
        registry = cls(lambda: models, noun=noun)
        registry._install(models)
        return registry

    def _install(self, loaded: Iterable[Served]) -> None:
        models: dict[str, dict[str, Served]] = {}
        for model in loaded:
            models.setdefault(model.name, {})[model.version] = model
        self._models = models
        self._loaded = True
        self._newest = {name: self.resolve(name, self.versions(name)[-1]) for name in models}

    def put(self, name: str, versions: Iterable[Served]) -> list[Served]:
        """Serve these versions of `name` (started) from now on, in place of those it served:
        returned, for their owner to retire (v2server/control.py)."""
        replaced = list(self._models.get(name, {}).values())
        self._models = {**self._models, name: {m.version: m for m in versions}}
        self._newest = {**self._newest, name: self.resolve(name, self.versions(name)[-1])}
        return replaced

    def take(self, name: str) -> list[Served]:
        """Serve `name` no more; its versions returned, for their owner to retire."""
        taken = list(self._models.get(name, {}).values())
        self._models = {n: v for n, v in self._models.items() if n != name}
        self._newest = {n: m for n, m in self._newest.items() if n != name}
        return taken

    async def start(self) -> None:
        self._install(await asyncio.to_thread(lambda: list(self._load())))
        await asyncio.gather(*(m.start() for m in self.loaded()))
        self._ready = True
        for name in self.names():
            log.info("loaded", extra={"fields": {self.noun: name, "versions": self.versions(name)}})

    async def stop(self) -> None:
        self._ready = False
        await asyncio.gather(*(m.stop() for m in self.loaded()))
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    @property
    def ready(self) -> bool:
        return self._ready and all(m.ready for m in self.loaded())

    def names(self) -> list[str]:
        return sorted(self._models)

    def versions(self, name: str) -> list[str]:
        """Loaded versions of a model, oldest first; raises NotFound."""
        return sorted(self._lookup(name), key=_version_key)

    def loaded(self, name: str = "", version: str = "") -> list[Served]:
        """The named version, every loaded version of `name`, or (no name) of every model;
        NotFound for unknown names and versions."""
        if name and version:
            return [self.resolve(name, version)]
        names = [name] if name else self.names()
        return [self.resolve(n, v) for n in names for v in self.versions(n)]

    def resolve(self, name: str, version: str = "") -> Served:
        """The version asked for, or the newest; raises NotFound naming what is loaded."""
        if not version and name in self._newest:
            return self._newest[name]
        versions = self._lookup(name)
        try:
            return versions[version]
        except KeyError:
            raise NotFound(
                f"{self.noun} '{name}' has no version '{version}' "
                f"(loaded: {', '.join(self.versions(name))})"
            ) from None

    def _lookup(self, name: str) -> dict[str, Served]:
        if not self._loaded:
            # The port opens before the models load (health answers NOT_SERVING meanwhile):
            # a caller that gets here early must retry, not be told the model does not exist.
            raise Unavailable(f"the server is still loading its {self.noun}s")
        try:
            return self._models[name]
        except KeyError:
            raise NotFound(
                f"unknown {self.noun} '{name}' "
                f"(this server has: {', '.join(self.names()) or 'none'})"
            ) from None
