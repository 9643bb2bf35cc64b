"""The seam between the engine and the transport: one step's call, however it travels.

The engine hands over what to send and what time is left; `Calls.call` chooses how the call
goes (one message, merged with other requests' calls to the same model (merging.py), or in
chunks along the batch axis (chunks.py)) and retries it within the request's deadline:
UNAVAILABLE (or CANCELLED: the endpoint restarting) with jittered backoff. Every failure is
the StepError that names the step and the endpoint (proxy/errors.py maps it to a status).
A call to an endpoint that is not answering fails at once (breaker.py)."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from protos import tracing
from protos.channels import SERVICE_NAME
from protos.tracing import Shape, Span, SpanKind
from proxy.errors import StepError
from proxy.transport import chunks
from proxy.transport.breaker import Breaker, Breakers
from proxy.transport.channels import RETRYABLE, Channels, Infer
from proxy.transport.failures import CallFailed
from proxy.transport.members import HALVED, HALVED_DECLARED, Tensors
from proxy.transport.merging import Merger
from proxy.transport.services import Services
from proxy.transport.target import Target


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


class Calls:
    """Every step's calls of this process: one place decides how each travels."""

    def __init__(self, channels: Channels, services: Services, merge: bool = False) -> None:
        self.channels = channels
        self.services = services
        self.merger = Merger(channels.infer, channels.max_message) if merge else None
        self.breakers = Breakers(services.ready)

    async def call(
        self, call: Call, inputs: Mapping[str, np.ndarray], deadline: float, request_id: str
    ) -> Tensors:
        """`call` with `inputs`, within `deadline` (absolute, loop time)."""
        channels, target = self.channels, call.target
        breaker = self.breakers.get(target.address)

        async def send(feeds: Mapping[str, np.ndarray], via: Infer | None = None) -> Tensors:
            return await infer_with_retries(
                channels, call, feeds, deadline, request_id, via, breaker
            )

        one_call = (
            max(a.shape[0] if a.ndim else 1 for a in inputs.values()) <= 1
            and sum(chunks.nbytes(a) for a in inputs.values())
            <= chunks.HEADROOM * channels.max_message
        )
        if one_call and self.merger is None:
            return await send(inputs)  # one row that fits: the common case, no lookup
        if breaker.refusing:  # the lookup below would wait on it too
            raise refused(call.label, breaker)
        # Asked once a model (remembered; asked again in the background every refresh_s),
        # within a second at most: a silent endpoint held each first call here for its whole
        # budget. Unanswered, the call goes alone.
        remaining = deadline - asyncio.get_running_loop().time()
        max_batch = await self.services.batch_size(
            target.address, target.model, target.version, max(0.05, min(remaining, 1.0)), breaker
        )
        if one_call and self.merger is not None and max_batch > 0:
            declared = self.services.as_declared(target.address, target.model, target.version)
            halve = HALVED_DECLARED if declared else HALVED
            lane = self.merger.lane(call.label, target, call.outputs, inputs, max_batch, halve)
            return await send(inputs, lane.infer)
        if one_call:
            return await send(inputs)
        rows = chunks.plan(inputs, max_batch, channels.max_message, call.label)
        try:
            return await _in_rows(send, inputs, rows)
        except StepError as exc:
            if exc.code != grpc.StatusCode.INVALID_ARGUMENT or max_batch == 0:
                raise
            # Rows the model refused: it may have been reloaded with a smaller batch size
            # since it was last asked. Asked again now, and sent again in what it takes.
            remaining = deadline - asyncio.get_running_loop().time()
            taken = await self.services.batch_size(
                target.address,
                target.model,
                target.version,
                max(0.05, min(remaining, 1.0)),
                recheck=True,
            )
            if taken >= max_batch:
                raise
        rows = chunks.plan(inputs, taken, channels.max_message, call.label)
        return await _in_rows(send, inputs, rows)


async def _in_rows(
    send: Callable[[Mapping[str, np.ndarray]], Awaitable[Tensors]],
    inputs: Mapping[str, np.ndarray],
    rows: list[slice] | None,
) -> Tensors:
    return await send(inputs) if rows is None else await chunks.call_in_chunks(send, inputs, rows)


async def infer_with_retries(
    channels: Channels,
    call: Call,
    inputs: Mapping[str, np.ndarray],
    deadline: float,
    request_id: str,
    via: Infer | None = None,
    breaker: Breaker | None = None,
) -> dict[str, np.ndarray]:
    """ModelInfer within the request's deadline, retrying UNAVAILABLE with jittered backoff;
    `via` sends each attempt (default: channels.infer; a merging lane, merging.py); `breaker`
    hears how each attempt ended, and refuses attempts while the endpoint is not answering."""
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
        if breaker is not None and breaker.refusing:
            raise refused(step, breaker)
        token = (
            breaker.sending(call.target.model, asyncio.current_task()) if breaker is not None else 0
        )
        try:
            with attempt_span(call, attempt) if tracing.ENABLED else tracing.NO_SPAN:
                outputs = await send(
                    call.target,
                    inputs,
                    outputs=call.outputs,
                    timeout=timeout,
                    request_id=request_id,
                )
            if breaker is not None:
                breaker.answered(token)
                if breaker.let_go(token):  # answered as it was let go: the answer stands
                    _taken_back()
            return outputs
        except CallFailed as exc:
            code = exc.code()
            if breaker is not None:
                breaker.missed(token, code, exc.details(), call.target.model)
                if breaker.let_go(token) and _taken_back():  # a layer below made it a failure
                    raise refused(step, breaker) from None
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (
                exc.details() or ""
            ):
                raise StepError(
                    step,
                    code,
                    f"a message to or from {address} is over the size limit ({exc.details()})",
                    http=413,
                ) from None
            if code in RETRYABLE and attempt < call.retries and not (breaker and breaker.refusing):
                attempt += 1
                backoff = min(0.05 * 2**attempt, 0.5) * (0.5 + random.random() / 2)
                if deadline - loop.time() > backoff:
                    await asyncio.sleep(backoff)
                    continue
            raise StepError(step, code, _describe(code, exc.details(), address)) from None
        except BaseException as exc:  # cancelled (a client gone, a sibling branch failed)
            if breaker is not None:
                breaker.forget(token)
                # Let go as it failed otherwise: the breaker's cancellation is taken back
                # first (in that order), or it would cancel the request at its next await.
                cancelled = isinstance(exc, asyncio.CancelledError)
                if breaker.let_go(token) and _taken_back() and cancelled:
                    raise refused(step, breaker) from None
            raise


def _taken_back() -> bool:
    """The breaker's cancellation of this task taken back (breaker.py let the call go: its
    endpoint is not answering); False when the task is cancelled besides, by its caller."""
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


def refused(step: str, breaker: Breaker) -> StepError:
    """The failure of a call not sent: its endpoint is not answering."""
    return StepError(step, grpc.StatusCode.UNAVAILABLE, breaker.refuse())


def attempt_span(call: Call, attempt: int) -> Span:
    """One attempt's CLIENT span: the RPC as OTel's conventions name it, and the model."""
    target = call.target
    # Keyed by strings, not by the Target: a dataclass's hash is a Python call, twice a span.
    return tracing.span(
        _attempt_shape(call.label, target.address, target.model, target.version, attempt + 1)
    )


@functools.lru_cache(maxsize=1024)
def _attempt_shape(label: str, address: str, model: str, version: str, attempt: int) -> Shape:
    """What every such attempt of a step's call says (made once, not per request)."""
    host, _, port = address.rpartition(":")
    attributes: list[tuple[str, str | int]] = [
        ("rpc.system", "grpc"),
        ("rpc.service", SERVICE_NAME),
        ("rpc.method", "ModelInfer"),
        ("server.address", host or address),
        ("mesh.step", label),
        ("mesh.model", model),
        ("mesh.model_version", version),
        ("mesh.attempt", attempt),
    ]
    if port.isdigit():
        attributes.append(("server.port", int(port)))
    return tracing.shape(f"{SERVICE_NAME}/ModelInfer", SpanKind.CLIENT, tuple(attributes))


def _describe(code: grpc.StatusCode, details: str | None, address: str) -> str:
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"endpoint {address} unavailable ({details})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"endpoint {address} did not answer in time"
    return details or code.name
