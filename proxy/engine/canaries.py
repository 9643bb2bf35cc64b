"""Canaries: a share of a step's calls sent to a new model instead of the live one.

KServe's `canaryTrafficPercent`, Seldon Core's experiment candidates: `<VARIABLE>_CANARY`
names where the share goes and `<VARIABLE>_CANARY_PERCENT` how much of it. Unlike a shadow
(shadows.py), the canary's answer is the client's answer: its errors, its latency and its
outputs are what the request gets, and the metrics below set them beside the live model's,
so that a rollout is judged before the variable itself is changed.

A call goes to the canary by its request's id, not by chance: a client that sends a request
again under the same `X-Request-Id` (a retry) meets the same model, and every proxy replica
chooses alike (CRC-32 of the id and the step, not Python's seeded
hash). Requests without an id of their own get a fresh one, so they spread at the percent.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protos.metric_types import Histogram
from proxy.transport.target import Target

if TYPE_CHECKING:
    from proxy.engine.plan import Plan

STEP_LATENCY = Histogram(
    "proxy_canary_step_duration_seconds",
    "Latency of the calls of steps with a canary (<VARIABLE>_CANARY), by pipeline, step "
    "(<parallel step>/<branch> for a branch), variant (live, canary) and status: the "
    "canary's error rate and latency beside the live model's",
    ["pipeline", "step", "variant", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


@dataclass(frozen=True)
class Canary:
    """Where a share of a step's calls goes instead, and how large a share (percent)."""

    target: Target
    percent: float

    def takes(self, request_id: str, label: str) -> bool:
        """Whether the call of step `label` for this request goes to the canary."""
        if self.percent >= 100:
            return True
        spot = zlib.crc32(f"{label}\0{request_id}".encode()) % 10_000
        return spot < self.percent * 100


def by_choice(key: bytes | None, canaries: dict[str, Canary], request_id: str) -> bytes | None:
    """A request's inference-cache key with the steps whose canary its id takes (unchanged:
    none, the key is the live models'). A request sent to a canary then neither finds the
    live models' answers nor shares a computation with an identical request whose id chose
    otherwise: each gets the model its id chose."""
    if key is None or not canaries:
        return key
    taken = [label for label, canary in canaries.items() if canary.takes(request_id, label)]
    return key if not taken else key + b"\0canary\0" + "\0".join(sorted(taken)).encode()


def answered_by(plan: Plan, label: str, variant: str | None) -> Target | None:
    """The target whose answer call `label` gave: its canary's where `variant` says the
    canary answered it, else the step's own (None: not a call)."""
    if variant == "canary" and (canary := plan.canaries.get(label)) is not None:
        return canary.target
    return plan.targets.get(label)
