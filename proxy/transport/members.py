"""The members of a merged call (merging.py): what each brought, what they must share
to be merged, and each one's rows of the answer."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import grpc
import numpy as np

from protos import tracing
from protos.tracing import Span, SpanKind
from proxy.transport.chunks import nbytes
from proxy.transport.failures import CallFailed

Tensors = dict[str, np.ndarray]

tokens = itertools.count()
"""Names of calls out, for their lane's accounting."""


@dataclass(eq=False)
class Member:
    inputs: Mapping[str, np.ndarray]
    rows: int
    size: int
    deadline: float
    request_id: str
    answer: asyncio.Future[Tensors]
    call: Merged | None = None
    span: Span | None = None
    """The caller's span (traces on): the merged call links to it."""


@dataclass(eq=False)
class Merged:
    members: list[Member]
    token: int = field(default_factory=lambda: next(tokens))
    task: asyncio.Task[None] | None = None


def signature(inputs: Mapping[str, np.ndarray]) -> tuple:
    """What members must share to be merged: names, types and every dimension but the first."""
    # The dtype itself, not its .str (a new string each time); one input without a sort.
    if len(inputs) == 1:
        for name, a in inputs.items():
            return ((name, a.dtype, a.shape[1:]),)
    return tuple(sorted((name, a.dtype, a.shape[1:]) for name, a in inputs.items()))


def rows_of(inputs: Mapping[str, np.ndarray]) -> int:
    return max((a.shape[0] for a in inputs.values() if a.ndim), default=1)


def size_of(inputs: Mapping[str, np.ndarray]) -> int:
    return sum(nbytes(a) for a in inputs.values())


def split(answer: Tensors, rows: list[int]) -> list[Tensors] | None:
    """Each member's rows of every output; None when an output has no row per input row."""
    total = sum(rows)
    if any(a.ndim == 0 or a.shape[0] != total for a in answer.values()):
        return None
    bounds = [0, *itertools.accumulate(rows)]  # np.cumsum of a list takes a slow path
    return [
        {name: a[start:stop] for name, a in answer.items()}
        for start, stop in itertools.pairwise(bounds)
    ]


def merged_span(members: list[Member]) -> AbstractContextManager:
    """The merged call's CLIENT span (traces on): a child of its first member's attempt,
    linked to every member's, so each request's trace finds the call it shared."""
    if not tracing.ENABLED:
        return tracing.NO_SPAN
    links = [m.span for m in members if m.span is not None]
    parent = members[0].span
    attributes = {
        "mesh.merged.members": len(members),
        "mesh.merged.rows": sum(m.rows for m in members),
    }
    return tracing.span(tracing.shape("merged call", SpanKind.CLIENT), parent, links, attributes)


def fail(member: Member, exc: CallFailed) -> None:
    if not member.answer.done():
        member.answer.set_exception(exc)


HALVED = frozenset({grpc.StatusCode.INVALID_ARGUMENT})
"""A merged call failing so is sent again by halves (deliver): one bad member fails alone."""
HALVED_DECLARED = HALVED | {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
"""The same for a model whose batch size its variable declared (`<VARIABLE>_MAX_BATCH_SIZE`,
a lane's `halve`): a server's own failure of a merged call may be a batch it cannot take."""


def joined(members: list[Member]) -> Mapping[str, np.ndarray]:
    """The members' inputs as one call's, along the batch axis (`split`'s inverse)."""
    if len(members) == 1:
        return members[0].inputs
    first = members[0].inputs
    return {name: np.concatenate([m.inputs[name] for m in members]) for name in first}


async def deliver(
    members: list[Member],
    call: Callable[[list[Member]], Awaitable[Tensors]],
    alone: bool,
    halve: frozenset[grpc.StatusCode] = HALVED,
) -> bool:
    """Answer `members` through `call` (one call for all of them, or one each when `alone`);
    False when the model's answer has no row per member (they were then sent one each).
    A call of several failing with a code in `halve` is sent again by halves."""
    if alone:
        await _one_each(members, call)
        return True
    if not members:
        return True
    try:
        answer = await call(members)
    except CallFailed as exc:
        if exc.code() in halve and len(members) > 1:
            # One bad member must not fail the others: each half is sent again, and so
            # on down to the bad one (2 log2(n) calls, not n: blank images mixed into
            # digits once cut normal throughput by a fifth).
            live = [m for m in members if not m.answer.done()]
            half = len(live) // 2
            done = await asyncio.gather(
                deliver(live[:half], call, alone, halve), deliver(live[half:], call, alone, halve)
            )
            return all(done)
        for member in members:
            fail(member, exc)
        return True
    parts = split(answer, [m.rows for m in members])
    if parts is None:
        await _one_each(members, call)
        return False
    for member, part in zip(members, parts, strict=True):
        if not member.answer.done():
            member.answer.set_result(part)
    return True


async def _one_each(
    members: list[Member], call: Callable[[list[Member]], Awaitable[Tensors]]
) -> None:
    async def one(member: Member) -> None:
        try:
            answer = await call([member])
        except CallFailed as exc:
            fail(member, exc)
        else:
            if not member.answer.done():
                member.answer.set_result(answer)

    await asyncio.gather(*(one(m) for m in members if not m.answer.done()))
