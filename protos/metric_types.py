"""Prometheus metric types for the mesh's hot paths: prometheus-client's Counter, Gauge and
Histogram, registered and exposed by it as ever, whose values are plain numbers updated
without a lock.

prometheus-client guards every value with a mutex and checks, on every update, that the
metric is not a labelled parent: a histogram's `observe` is ~6 Python calls and two lock
round trips, and with an exemplar it validates the exemplar's labels each time. A `digits`
request makes ~9 updates in the proxy and ~4 in each service: ~49 and ~14 Python calls, 2.7%
and 5% of them (cProfile). Here an update is one call.

Without the locks, an update is safe from one thread at a time. The mesh's updates all run
on their process's event loop; a scrape (another thread, the metrics server's) reads each
number whole, as prometheus-client's own collection does value by value.

With several proxy workers (PROMETHEUS_MULTIPROC_DIR set before prometheus-client is
imported), values live in files shared by the workers: these are then prometheus-client's
own classes, unchanged.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable

import prometheus_client
from prometheus_client import metrics, values
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

MULTIPROCESS = values.ValueClass is not values.MutexValue
"""prometheus-client chose file-backed values (several workers): its classes are used."""


class Value:
    """MutexValue's interface without the mutex (tests and prometheus-client read `get`)."""

    __slots__ = ("exemplar", "value")

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        self.value = 0.0
        self.exemplar: Exemplar | None = None

    def inc(self, amount: float) -> None:
        self.value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.value = value

    def set_exemplar(self, exemplar: Exemplar) -> None:
        self.exemplar = exemplar

    def get(self) -> float:
        return self.value

    def get_exemplar(self) -> Exemplar | None:
        return self.exemplar


class _Counter(prometheus_client.Counter):
    def _metric_init(self) -> None:
        self._value = Value()
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value.value += amount
        if exemplar:
            self._value.exemplar = Exemplar(exemplar, amount, time.time())


class _Gauge(prometheus_client.Gauge):
    def _metric_init(self) -> None:
        self._value = Value()

    def inc(self, amount: float = 1) -> None:
        self._value.value += amount

    def dec(self, amount: float = 1) -> None:
        self._value.value -= amount

    def set(self, value: float) -> None:
        self._value.value = float(value)


class _Histogram(prometheus_client.Histogram):
    """Counts per bucket (not cumulative: an observation adds one number), the sum, and
    each bucket's last exemplar. Exemplars are not validated: the mesh's are a trace id and a
    span id (63 characters, under OpenMetrics' 128)."""

    def _metric_init(self) -> None:
        self._created = time.time()
        self._counts = [0] * len(self._upper_bounds)
        self._total = 0.0
        self._exemplars: list[Exemplar | None] = [None] * len(self._upper_bounds)

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        # The first bound >= amount, as prometheus-client's `amount <= bound` scan finds.
        i = bisect_left(self._upper_bounds, amount)
        self._counts[i] += 1
        self._total += amount
        if exemplar:
            self._exemplars[i] = Exemplar(exemplar, amount, time.time())

    def _child_samples(self) -> Iterable[Sample]:
        counts, exemplars = list(self._counts), list(self._exemplars)
        samples, acc = [], 0.0
        for bound, count, exemplar in zip(self._upper_bounds, counts, exemplars, strict=True):
            acc += count
            samples.append(Sample("_bucket", {"le": floatToGoString(bound)}, acc, None, exemplar))
        samples.append(Sample("_count", {}, acc, None, None))
        if self._upper_bounds[0] >= 0:
            samples.append(Sample("_sum", {}, self._total, None, None))
        if metrics._use_created:  # PROMETHEUS_DISABLE_CREATED_SERIES unset
            samples.append(Sample("_created", {}, self._created, None, None))
        return tuple(samples)


if MULTIPROCESS:
    Counter, Gauge, Histogram = (
        prometheus_client.Counter,
        prometheus_client.Gauge,
        prometheus_client.Histogram,
    )
else:
    Counter, Gauge, Histogram = _Counter, _Gauge, _Histogram  # type: ignore[misc]
