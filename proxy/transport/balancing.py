"""Client-side balancing over a service's replicas: calls *and* streams spread by load.

gRPC's own `round_robin` spreads calls, but a long-lived ModelStreamInfer stream stays on the
replica it opened on, and a pool of two streams in front of five pods uses at most two. So for
a name that stands for replicas (`dns:///name:port`, e.g. a Kubernetes headless Service, or
`ipv4:a:port,b:port`), the proxy resolves the name itself (again every `resolve_interval_s`,
and soon after a replica fails), keeps a channel and its streams per address, and sends each
call to the replica with the fewest calls in flight (in turn when equal). A replica whose
channel is in TRANSIENT_FAILURE, or that failed a call with UNAVAILABLE or CANCELLED (until
its channel is READY again), is passed over while others are up, so a retry lands
elsewhere; after its pause it gets one call at a time until one succeeds. So is a replica
whose oldest call in flight has stalled (stalls.py: out several times longer than the
name's calls usually take): a frozen or unreachable replica answers nothing, not an error,
and would otherwise keep drawing calls until keepalive closes its connection
(hedging.py sends its stalled calls elsewhere).
`PROXY_BALANCE=grpc` hands the name to gRPC's `round_robin` instead (per call on
unary calls; a stream stays where it opened).

A plain `host:port` in front of replicas (a Service that balances connections) gets
`PROXY_CONNECTIONS_PER_ENDPOINT` connections, picked the same way.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from proxy import metrics
from proxy.transport.stalls import InFlight, Pace

log = logging.getLogger(__name__)

REPLICA_SCHEMES = ("dns:///", "ipv4:", "ipv6:")
CONNECTION = "#"
"""`host:port#i`: the i-th of several connections to one address (see Replicas)."""


def names_replicas(target: str) -> bool:
    return target.startswith(REPLICA_SCHEMES)


@dataclass
class Replica:
    address: str
    """host:port (an IPv6 host in brackets)."""
    down_until: float = 0.0
    """Passed over until then after failing (longer each time in a row)."""
    failures: int = 0
    """Failures in a row; while any, also passed over until its connection is READY."""
    calls: InFlight = field(default_factory=InFlight)
    """Its calls out now, by when each left."""

    @property
    def load(self) -> int:
        """Calls in flight."""
        return len(self.calls)


class Replicas:
    """The addresses behind one name, and which to call next."""

    def __init__(
        self,
        target: str,
        resolve_interval_s: float,
        state: Callable[[str, bool], grpc.ChannelConnectivity | None],
        connections: int = 1,
    ) -> None:
        """`connections`: for one plain address (no scheme), that many connections to it,
        picked as replicas are: behind a Service that balances connections (a Kubernetes
        ClusterIP, KServe's predictors), each may reach another replica."""
        self.target = target
        self.host = ""
        """The DNS name (for TLS: the certificate names it, not the address)."""
        self._interval = resolve_interval_s
        self._state = state
        """An address's channel state (the flag: try to connect), None before its channel
        exists."""
        self._replicas: dict[str, Replica] = {}
        self._next_resolve = 0.0
        self._resolving: asyncio.Task[None] | None = None
        self._turn = 0
        self.pace = Pace()
        """What the name's calls usually take (any replica), to tell a stalled call."""
        self.removed: list[str] = []
        """Addresses the last resolution dropped, for the caller to close."""
        for counter in (metrics.REPLICAS_PASSED_OVER, metrics.HEDGED, metrics.HEDGES_WON):
            # Born at 0: Prometheus's increase() cannot see a series' first count, so an
            # endpoint's first pass-over would never reach the dashboard or the alert.
            counter.labels(target)
        if target.startswith("dns:///"):
            self.host, _, port = target.removeprefix("dns:///").rpartition(":")
            self._port = int(port)
        else:
            if names_replicas(target):
                listed = target.partition(":")[2].split(",")
            else:
                listed = [f"{target}{CONNECTION}{i}" for i in range(connections)]
            self._replicas = {a: Replica(a) for a in listed}
            self._next_resolve = float("inf")

    @property
    def addresses(self) -> list[str]:
        return list(self._replicas)

    async def pick(self) -> Replica:
        """The replica for the next call; resolves first if the name was never resolved."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not self._replicas:
            await self._resolve()
            if not self._replicas:
                raise LookupError(f"{self.target} resolves to no address")
        elif now >= self._next_resolve and self._resolving is None:
            self._resolving = asyncio.ensure_future(self._resolve())
        replicas = list(self._replicas.values())
        up = [r for r in replicas if r.down_until <= now and self._usable(r)]
        flowing = [r for r in up if self._flowing(r)]
        candidates = flowing or up or sorted(replicas, key=lambda r: r.down_until)[:1]
        # Fewest in flight; equal loads in turn (so calls one at a time alternate).
        self._turn += 1
        start = self._turn % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda r: r.load)

    def _flowing(self, replica: Replica) -> bool:
        """Up, and neither stalled (its oldest call in flight out longer than this name's
        calls stall) nor failing with a call already on it (half-open: after its pause a
        failed replica gets one call at a time until one succeeds, so that a burst does not
        all land on it the moment its pause ends)."""
        stalled = replica.calls.stalled(time.monotonic(), self.pace.stall_after())
        return not stalled and not (replica.failures and replica.load)

    def alternative(self, replica: Replica) -> Replica | None:
        """Another replica that is up and flowing (the least busy), if any."""
        now = asyncio.get_running_loop().time()
        others = [
            r
            for r in self._replicas.values()
            if r is not replica and r.down_until <= now and self._usable(r) and self._flowing(r)
        ]
        return min(others, key=lambda r: r.load) if others else None

    def _usable(self, replica: Replica) -> bool:
        """Not known to fail: its connection is not failing and, after it failed, is READY
        again (asking gRPC to reconnect in the background meanwhile, so that no call is
        spent finding out; a SIGKILLed replica's connection goes IDLE, not failing)."""
        state = self._state(replica.address, replica.failures > 0)
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return False
        return replica.failures == 0 or state in (None, grpc.ChannelConnectivity.READY)

    def failed(self, replica: Replica) -> None:
        """The replica answered UNAVAILABLE or CANCELLED (the retry goes elsewhere): pass
        it over for a while, longer each time in a row, and until its connection is READY;
        look the name up again soon (a replaced pod has a new address)."""
        replica.failures += 1
        if replica.failures == 1:  # where it had been answering: one log line a spell
            metrics.REPLICAS_PASSED_OVER.labels(self.target).inc()
            log.warning("%s: replica %s passed over", self.target, replica.address)
        now = asyncio.get_running_loop().time()
        replica.down_until = now + min(0.1 * 2 ** (replica.failures - 1), 5.0)
        if self._next_resolve != float("inf"):
            self._next_resolve = min(self._next_resolve, now + 0.5)

    def succeeded(self, replica: Replica) -> None:
        if replica.failures:
            log.info("%s: replica %s answers again", self.target, replica.address)
        replica.failures = 0
        replica.down_until = 0.0

    async def _resolve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self.host, self._port, type=socket.SOCK_STREAM)
        except OSError as exc:
            log.warning("cannot resolve %s (%s); keeping %s", self.target, exc, self.addresses)
            infos = []
        finally:
            self._next_resolve = loop.time() + self._interval
            self._resolving = None
        found = []
        for family, *_, sockaddr in infos:
            host = f"[{sockaddr[0]}]" if family == socket.AF_INET6 else sockaddr[0]
            found.append(f"{host}:{sockaddr[1]}")
        if not found:
            return
        fresh = {a: self._replicas.get(a) or Replica(a) for a in dict.fromkeys(found)}
        self.removed += [a for a in self._replicas if a not in fresh]
        if fresh.keys() != self._replicas.keys():
            log.info("%s: replicas %s", self.target, sorted(fresh))
        self._replicas = fresh
