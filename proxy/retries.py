"""A step's call with its retries: within the request's deadline, UNAVAILABLE (or CANCELLED:
the endpoint restarting) retried with jittered backoff, every failure turned into the
StepError that names the step and the endpoint (proxy/errors.py maps it to a status)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from proxy.client import RETRYABLE, Channels, Infer
from proxy.endpoints import Target
from proxy.errors import StepError
from proxy.streams import CallFailed


@dataclass(frozen=True)
class Call:
    """One step's (or branch's) call: where it goes, what it asks for, how long each
    attempt may take and how many more attempts UNAVAILABLE earns."""

    label: str
    """The step, or `<parallel step>/<branch>`: errors name it."""
    target: Target
    outputs: Sequence[str]
    per_call_s: float | None
    retries: int


async def infer_with_retries(
    channels: Channels,
    call: Call,
    inputs: Mapping[str, np.ndarray],
    deadline: float,
    request_id: str,
    via: Infer | None = None,
) -> dict[str, np.ndarray]:
    """ModelInfer within the request's deadline, retrying UNAVAILABLE with jittered backoff;
    `via` sends each attempt (default: channels.infer; a merging lane, proxy/merging.py)."""
    send = channels.infer if via is None else via
    loop = asyncio.get_running_loop()
    step, address = call.label, call.target.address
    attempt = 0
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0.001:
            raise StepError(
                step, grpc.StatusCode.DEADLINE_EXCEEDED, "no time left in the request's budget"
            )
        timeout = remaining if call.per_call_s is None else min(call.per_call_s, remaining)
        try:
            return await send(
                call.target, inputs, outputs=call.outputs, timeout=timeout, request_id=request_id
            )
        except CallFailed as exc:
            code = exc.code()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (
                exc.details() or ""
            ):
                raise StepError(
                    step,
                    code,
                    f"a message to or from {address} is over the size limit ({exc.details()})",
                    http=413,
                ) from None
            if code in RETRYABLE and attempt < call.retries:
                attempt += 1
                backoff = min(0.05 * 2**attempt, 0.5) * (0.5 + random.random() / 2)
                if deadline - loop.time() > backoff:
                    await asyncio.sleep(backoff)
                    continue
            raise StepError(step, code, _describe(code, exc.details(), address)) from None


def _describe(code: grpc.StatusCode, details: str | None, address: str) -> str:
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"endpoint {address} unavailable ({details})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"endpoint {address} did not answer in time"
    return details or code.name
