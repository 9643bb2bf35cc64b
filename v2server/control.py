"""Model control, as Triton's `--model-control-mode`: which models of its repository a service
serves, and how that changes while it runs.

- `none` (the default): the models loaded at start, until the service stops.
- `explicit`: RepositoryModelLoad loads a model, or reloads it, and RepositoryModelUnload
  unloads it (tritonclient's `load_model` and `unload_model`). `--load-model` names the
  models loaded at start (`*`: every one).
- `poll`: the repository is read again every `--repository-poll-secs`. A model whose files
  changed is reloaded, a new one is loaded, and a removed one is unloaded.

A reload builds and warms up the model's versions beside the ones serving, then puts them in
their place in one step. A request goes to the versions serving when it arrives.
A version taken out of service is retired: no new request reaches it, it finishes the
requests it holds (up to `grace_s`), then it stops. So a reload under load fails no
request. A load that fails leaves the versions serving as they were, and says why: in the
RPC's error (in poll mode a log line), in `v2_model_load_failing` until a load succeeds, and
for a model not serving at all in the repository index's `reason`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Literal, Protocol

from protos.errors import InvalidInput, NotFound, Unsupported, few
from protos.metric_types import Counter, Gauge
from v2server import metrics
from v2server.model import LoadError, Served
from v2server.registry import Registry

log = logging.getLogger("v2server")

Mode = Literal["none", "explicit", "poll"]

LOADS = Counter(
    "v2_model_loads_total",
    "Models loaded, reloaded, unloaded, or failed to load while the service runs",
    ["model", "outcome"],
)
LOAD_FAILING = Gauge(
    "v2_model_load_failing",
    "1 while the model's files in the repository cannot be loaded (what served before still "
    "serves); 0 otherwise",
    ["model"],
)


class Repository(Protocol):
    """Where a service's models come from (predictors/repository.py: ONNX files)."""

    def names(self) -> list[str]:
        """The models it holds now (those the service may serve)."""
        ...

    def stamp(self, name: str) -> object:
        """Something that changes whenever the model's files do."""
        ...

    def build(self, name: str) -> list[Served]:
        """The versions its policy picks, built and not started; LoadError naming the
        file when they cannot be."""
        ...


class ModelControl:
    def __init__(
        self,
        registry: Registry,
        repository: Repository | None = None,
        mode: Mode = "none",
        *,
        poll_s: float = 15.0,
        grace_s: float = 30.0,
        linger_s: float = 1.0,
    ) -> None:
        """`linger_s`: how long a retired version still takes requests that found it just
        before it was replaced (between resolving a model and calling it)."""
        if mode != "none" and repository is None:
            raise ValueError(f"model control mode {mode} needs a repository")
        self.registry = registry
        self.repository = repository
        self.mode = mode
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.linger_s = linger_s
        self.reasons: dict[str, str] = {}
        """A model of the repository not serving -> why (unloaded, or its load failed)."""
        self._stamps: dict[str, object] = {}
        """What each model's files were when last loaded, or last tried."""
        self._lock = asyncio.Lock()  # one load or unload at a time
        self._retiring: set[asyncio.Task[None]] = set()
        self._loading: set[asyncio.Future[None]] = set()
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """After the registry's start: remember what was loaded, then poll if asked to."""
        for name in self.registry.names():  # its alert's series, 0 while loads succeed
            LOAD_FAILING.labels(name).set(0)
        if self.repository is None or self.mode == "none":
            return
        for name in self.registry.names():
            self._stamps[name] = await asyncio.to_thread(self.repository.stamp, name)
        if self.mode == "explicit":  # the index lists them, as Triton's does
            for name in await asyncio.to_thread(self.repository.names):
                if name not in self._stamps:
                    self.reasons[name] = "not loaded"
        if self.mode == "poll":
            self._poller = asyncio.create_task(self._poll(), name="model-control-poll")

    async def stop(self) -> None:
        """Polling stopped; retired versions stopped at once (the service is stopping)."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        tasks = [*self._loading, *self._retiring]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ the RPCs

    async def load(self, name: str, parameters: Iterable[str] = ()) -> None:
        """RepositoryModelLoad: `name` loaded, or reloaded, from the repository."""
        self._explicit("load")
        if given := sorted(parameters):
            raise InvalidInput(
                f"cannot load model '{name}' with parameters {given}: this server loads "
                "from its repository only (its config file and version folders)"
            )
        # Shielded: a caller that leaves (its deadline shorter than a large model's load)
        # does not waste the load half done; the model is served once it is ready.
        task = asyncio.ensure_future(self._load(name))
        self._loading.add(task)
        task.add_done_callback(_settled)
        task.add_done_callback(self._loading.discard)
        await asyncio.shield(task)

    async def unload(self, name: str) -> None:
        """RepositoryModelUnload: every version of `name` retired (a model not loaded:
        nothing to do, as Triton)."""
        self._explicit("unload")
        async with self._lock:
            if name not in self.registry.names():
                await self._known(name)
                return
            self._retire(self.registry.take(name))
            self.reasons[name] = "unloaded"
            self._stamps.pop(name, None)
        _counted(name, "unloaded")
        log.info("unloaded", extra={"fields": {"model": name}})

    def _explicit(self, what: str) -> None:
        if self.mode != "explicit":
            raise Unsupported(
                f"cannot {what} models: model control mode is {self.mode} on this server "
                "(start it with --model-control-mode explicit)"
            )

    async def _known(self, name: str) -> list[str]:
        assert self.repository is not None
        names = await asyncio.to_thread(self.repository.names)
        if name not in names:
            raise NotFound(f"model repository has no model '{name}' (it has {few(names)})")
        return names

    # ------------------------------------------------------------ loading and retiring

    async def _load(self, name: str) -> None:
        assert self.repository is not None
        async with self._lock:
            await self._known(name)
            self._stamps[name] = await asyncio.to_thread(self.repository.stamp, name)
            serving = name in self.registry.names()
            try:
                built = await asyncio.to_thread(self.repository.build, name)
                await _start_all(built)
            except (LoadError, OSError, ValueError) as exc:  # a folder gone, a bad file
                kept = self.registry.versions(name) if serving else []
                if not serving:
                    self.reasons[name] = f"failed to load: {exc}"
                still = f"; still serving version(s) {', '.join(kept)}" if kept else ""
                _counted(name, "failed", failing=1)
                raise InvalidInput(f"model '{name}' failed to load: {exc}{still}") from None
            self._retire(self.registry.put(name, built))
            self.reasons.pop(name, None)
            metrics.SERVED.add(name)
        versions = [m.version for m in built]
        what = "reloaded" if serving else "loaded"
        _counted(name, what)
        log.info(what, extra={"fields": {"model": name, "versions": versions}})

    def _retire(self, models: Iterable[Served]) -> None:
        for model in models:
            task = asyncio.create_task(self._retired(model), name=f"retire-{model.name}")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retired(self, model: Served) -> None:
        try:
            await asyncio.sleep(self.linger_s)
            drained = getattr(model, "drained", None)  # ServedModel's; a test double may lack it
            if drained is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(drained(), self.grace_s)
        finally:
            await model.stop()

    # ------------------------------------------------------------ poll mode

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.rescan()
            except Exception:  # a poll that fails is tried again next period
                log.exception("model repository poll failed")

    async def rescan(self) -> None:
        """Load what is new or changed, unload what is gone (poll mode's period)."""
        assert self.repository is not None
        names = await asyncio.to_thread(self.repository.names)
        for name in names:
            stamp = await asyncio.to_thread(self.repository.stamp, name)
            if stamp == self._stamps.get(name):
                continue  # unchanged, or failed as it is: tried again once its files change
            try:
                await self._load(name)
            except (InvalidInput, NotFound) as exc:
                log.error("cannot load: %s", exc, extra={"fields": {"model": name}})
        async with self._lock:
            for name in sorted(set(self.registry.names()) - set(names)):
                self._retire(self.registry.take(name))
                self._stamps.pop(name, None)
                _counted(name, "unloaded")
                log.info("unloaded", extra={"fields": {"model": name, "why": "removed"}})
            for name in set(self.reasons) - set(names):
                del self.reasons[name]


def _settled(task: asyncio.Future[None]) -> None:
    """Its outcome read (the caller that waited may have left)."""
    if not task.cancelled():
        task.exception()


def _counted(model: str, outcome: str, failing: int = 0) -> None:
    LOADS.labels(model, outcome).inc()
    LOAD_FAILING.labels(model).set(failing)


async def _start_all(models: list[Served]) -> None:
    """Start (warm up) every version; if one fails, all are stopped (their threads freed)."""
    try:
        for model in models:
            await model.start()
    except BaseException:
        await asyncio.gather(*(m.stop() for m in models), return_exceptions=True)
        raise
