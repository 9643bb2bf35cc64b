"""The caches of this proxy, built once from the pipelines and the settings: each pipeline's
answers (`cache:` on the pipeline) and the steps' outputs (`cache: true` on a call step),
in process by default, or all in one Redis (PROXY_CACHE_URL) shared by the proxy's replicas.
An answer is kept when first computed, or with `admit: second` when computed again
(doorkeeper.py), for the pipeline's answers and its steps' outputs alike; the sightings are
kept where the entries are (in this process, or in the shared Redis).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TypeVar

from proxy.engine.cache.answers import Answers
from proxy.engine.cache.doorkeeper import Doorkeeper, SharedDoorkeeper
from proxy.engine.cache.entries import Stored, Tensors
from proxy.engine.cache.fingerprints import Fingerprints
from proxy.engine.cache.keys import STEPS
from proxy.engine.cache.stores import MemoryStore, RedisStore, Store
from proxy.engine.plan import Plan
from proxy.transport.catalog import Catalog

T = TypeVar("T")

STEPS_STORE = "steps"
"""The name (in metrics) of the in-process store of the steps' outputs."""
RENDERED_SHARE = 0.25
"""The rendered results' bytes, as a share of the pipelines' answers' (`rendered`)."""
RENDERED_STORE = "rendered"
"""The name (in metrics) of the in-process store of hits' results as JSON (`rendered`)."""
DOORKEEPER = b"\0doorkeeper\0"
"""Before a pipeline's prefix (or the steps'), its doorkeeper's keys in Redis: no entry's key
starts with it, so that clearing a pipeline's entries leaves its sightings (they are not
answers) and counts only entries."""
KEYS_PER_MB = 4096
"""Keys a doorkeeper remembers a MB of its store (`admit: second`): more than the store
can hold entries (a `digits` answer counts ~1 KB), at 4 bytes a key (doorkeeper.py)."""


class Caches:
    @staticmethod
    def wanted(plans: Mapping[str, Plan]) -> bool:
        """Some pipeline caches its answers, or some step its outputs."""
        return any(
            (p.pipeline.cache is not None and p.pipeline.cache.enabled)
            or any(s.cache for s in p.call_steps())
            for p in plans.values()
        )

    def __init__(
        self,
        plans: Mapping[str, Plan],
        catalog: Catalog,
        *,
        url: str | None,
        steps_mb: float,
        timeout_s: float,
        step_ttl_s: float = 300.0,
    ) -> None:
        self.prints = Fingerprints(catalog)
        self._shared: Store | None = RedisStore(url, timeout_s) if url else None
        self._steps_store: Store = self._shared or MemoryStore(int(steps_mb * 2**20), STEPS_STORE)
        self._step_ttl_s = step_ttl_s
        self._timeout_s = timeout_s
        self._stores: dict[str, Store] = {}
        answers_bytes = 0
        for name, plan in plans.items():
            config = plan.pipeline.cache
            if config is not None and config.enabled:
                answers_bytes += int(config.max_mb * 2**20)
                self._stores[name] = self._shared or MemoryStore(int(config.max_mb * 2**20), name)
        self.rendered = MemoryStore(int(answers_bytes * RENDERED_SHARE), RENDERED_STORE)
        """Hits' results as JSON, by their cache key (Engine.result_to_serialise), in a
        quarter (RENDERED_SHARE) of what the answers may hold: a repeat is rendered once,
        not on every hit (~20-30 us of a `digits` hit's ~275 in the proxy's app). Looked up
        only once the cache has answered the key, so nothing expired, evicted or cleared is
        answered from it; what is rendered for a key is the answer for it while the key
        holds (it covers the definition, the result template included, the models'
        versions, the inputs)."""
        self._with_steps = {
            name for name, plan in plans.items() if any(s.cache for s in plan.call_steps())
        }
        self._second = {
            name
            for name, plan in plans.items()
            if plan.pipeline.cache is not None and plan.pipeline.cache.admit == "second"
        }
        self._steps_doorkeeper = (
            self._doorkeeper(STEPS, int(steps_mb * KEYS_PER_MB)) if self._second else None
        )
        """One for every step admitting on a second sighting: their keys are the models'
        and inputs', shared by the pipelines calling the same model."""
        self._pipelines: dict[str, Answers] = {}
        self._steps: dict[tuple[str, str], Answers[Tensors]] = {}

    def has(self, pipeline: str) -> bool:
        """The pipeline caches its answers or some step's outputs."""
        return pipeline in self._stores or pipeline in self._with_steps

    def pipeline(
        self,
        plan: Plan,
        to_entry: Callable[[T], Stored | None],
        from_entry: Callable[[Stored], T],
    ) -> Answers[T] | None:
        """The pipeline's answers (None: it has no cache)."""
        store = self._stores.get(plan.name)
        if store is None:
            return None
        answers = self._pipelines.get(plan.name)
        if answers is None:
            config = plan.pipeline.cache
            assert config is not None
            doorkeeper = None
            if plan.name in self._second:
                prefix = plan.name.encode() + b"\0"
                doorkeeper = self._doorkeeper(prefix, int(config.max_mb * KEYS_PER_MB))
            answers = self._pipelines[plan.name] = Answers(
                plan.name, "", store, config.ttl_s, to_entry, from_entry, doorkeeper
            )
        return answers

    def _doorkeeper(self, prefix: bytes, keys: int) -> Doorkeeper | SharedDoorkeeper:
        """In the shared Redis when the entries are there, else in this process."""
        if self._shared is not None:
            return SharedDoorkeeper(DOORKEEPER + prefix, keys)
        return Doorkeeper(keys)

    def step(self, pipeline: str, step: str) -> Answers[Tensors]:
        answers = self._steps.get((pipeline, step))
        if answers is None:
            doorkeeper = self._steps_doorkeeper if pipeline in self._second else None
            answers = self._steps[(pipeline, step)] = Answers(
                pipeline,
                step,
                self._steps_store,
                self._step_ttl_s,
                Stored,
                _tensors_of,
                doorkeeper,
            )
        return answers

    async def clear(self, pipeline: str) -> int:
        """Drop a pipeline's answers, and the steps' outputs when it caches some (they are
        shared by the pipelines calling the same models); how many entries went."""
        cleared = 0
        store = self._stores.get(pipeline)
        if store is not None:
            cleared += await store.clear(pipeline.encode() + b"\0")
            await self.rendered.clear(pipeline.encode() + b"\0")
        if pipeline in self._with_steps:
            cleared += await self._steps_store.clear(STEPS)
        return cleared

    async def close(self) -> None:
        """The writes under way finished (within two of the store's timeouts: a sighting
        looked up, then the entry written), then the stores closed."""
        answers = [*self._pipelines.values(), *self._steps.values()]
        await asyncio.gather(*(a.settle(2 * self._timeout_s) for a in answers))
        for store in {id(s): s for s in [*self._stores.values(), self._steps_store]}.values():
            await store.close()


def _tensors_of(entry: Stored) -> Tensors:
    return dict(entry.tensors)  # the entry may answer several calls at once
