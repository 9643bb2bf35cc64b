"""The members of a merged call (proxy/merging.py): what each brought, what they must share
to be merged, and each one's rows of the answer."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from proxy.chunks import nbytes
from proxy.streams import CallFailed

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


@dataclass(eq=False)
class Merged:
    members: list[Member]
    token: int = field(default_factory=lambda: next(tokens))
    task: asyncio.Task[None] | None = None


def signature(inputs: Mapping[str, np.ndarray]) -> tuple:
    """What members must share to be merged: names, types and every dimension but the first."""
    return tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in inputs.items()))


def rows_of(inputs: Mapping[str, np.ndarray]) -> int:
    return max((a.shape[0] for a in inputs.values() if a.ndim), default=1)


def size_of(inputs: Mapping[str, np.ndarray]) -> int:
    return sum(nbytes(a) for a in inputs.values())


def split(answer: Tensors, rows: list[int]) -> list[Tensors] | None:
    """Each member's rows of every output; None when an output has no row per input row."""
    total = sum(rows)
    if any(a.ndim == 0 or a.shape[0] != total for a in answer.values()):
        return None
    bounds = np.cumsum([0, *rows])
    return [
        {name: a[start:stop] for name, a in answer.items()}
        for start, stop in itertools.pairwise(bounds)
    ]


def fail(member: Member, exc: CallFailed) -> None:
    if not member.answer.done():
        member.answer.set_exception(exc)
