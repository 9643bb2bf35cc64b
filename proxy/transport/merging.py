"""Caller-side batching: one step's calls to a batching model, made by requests in flight
together, merged along the batch axis into one call and the answer split by rows.

A call costs both ends of a hop about the same whether it carries one row or forty, so under
load the proxy sends fewer, fuller calls. The rule is the service batcher's: never wait for
company on a timer. A lane (one step, one model, one signature of inputs) keeps `slots`
calls in flight (one: measured best for `digits`, bench/README.md). A call that finds the
lane idle leaves at the end of the event loop's current turn, with whatever calls the same
turn made (the requests of one merged answer reach their next step in the same turn); the
calls that arrive while the lane is busy queue, and leave together when it frees (up to
the model's max_batch_size rows and the message limit).

Each member keeps what it had alone: its deadline (the merged call gets the latest; a
member whose time runs out is answered DEADLINE_EXCEEDED), its cancellation (a merged call
nobody waits for is cancelled), and its errors: members merge only when their inputs agree
in names, types and trailing dimensions, and a merged call failing INVALID_ARGUMENT is sent
again by halves (members.py), so a bad member fails alone. Any other failure reaches every
member, whose retries (calls.py) go through the lane again.

A lane never waits on a stalled call (stalls.py): it keeps its members but no slot, so the
calls queued behind it leave (to another replica, balancing.py). Callbacks that run however a
call ends (cancelled before it started too: a hang-up once took a lane's only slot for good)
keep its accounting; the last breaks the call's cycles (most of the collector's passes)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from protos import tracing
from protos.labelled import child
from proxy import metrics
from proxy.transport.channels import Infer
from proxy.transport.chunks import HEADROOM
from proxy.transport.failures import CallFailed, Expired, expire
from proxy.transport.members import (
    HALVED,
    Member,
    Merged,
    Tensors,
    deliver,
    fail,
    joined,
    merged_span,
    rows_of,
    signature,
    size_of,
    tokens,
)
from proxy.transport.stalls import InFlight, Pace
from proxy.transport.target import Target

SLOTS = 1
"""Calls one lane keeps in flight. On `digits` (bench pipelines), two sent 1.1-1.5 requests
per call at c=8-32 and one 1.5-3.3 (before the gathering turn), for 1.0-1.4x throughput."""

MAX_LANES = 1024
"""Lanes kept before the idle ones are dropped."""
MAX_STALLED = 8
"""Stalled calls a lane leaves out before it waits for one of them to end."""


@dataclass(eq=False)
class Lane:
    """One step's calls to one model with one signature of inputs."""

    label: str
    target: Target
    outputs: tuple[str, ...]
    max_rows: int
    max_bytes: int
    send: Infer
    slots: int = SLOTS
    queue: list[Member] = field(default_factory=list)
    calls: InFlight = field(default_factory=InFlight)
    """The lane's calls out now (merged or direct)."""
    pace: Pace = field(default_factory=Pace)
    gathering: bool = False
    """An idle lane's first caller is letting this turn's other calls join."""
    solo: bool = False
    """Set when the model's answers cannot be split by rows: members go alone."""
    halve: frozenset[grpc.StatusCode] = HALVED
    """How a merged call may fail for one of its members (members.deliver)."""
    _wake: asyncio.TimerHandle | None = None
    """Flushes the queue when the oldest busy call turns stalled."""

    @property
    def in_flight(self) -> int:
        return len(self.calls)

    def _free(self) -> bool:
        """A call may leave now: fewer than `slots` calls out that have not stalled."""
        if len(self.calls) >= self.slots + MAX_STALLED:
            return False
        return self.calls.busy(time.monotonic(), self.pace.stall_after()) < self.slots

    async def infer(
        self,
        target: Target,
        inputs: Mapping[str, np.ndarray],
        *,
        outputs: Sequence[str],
        timeout: float,
        request_id: str,
    ) -> Tensors:
        """Channels.infer's contract, merged with the lane's other calls when it is busy (a
        caller cancelled cancels its own answer only: the merged call goes on for the rest)."""
        send = functools.partial(
            self.send, target, inputs, outputs=outputs, timeout=timeout, request_id=request_id
        )
        if self.solo:
            return await self._direct(send())
        loop = asyncio.get_running_loop()
        rows, deadline = rows_of(inputs), loop.time() + timeout
        member = Member(inputs, rows, size_of(inputs), deadline, request_id, loop.create_future())
        if tracing.ENABLED:
            member.span = tracing.current()  # the merged call links to it
        self.queue.append(member)
        if not self.gathering and len(self.queue) == 1 and self._free():
            # An idle lane: the calls made in this turn of the event loop join before anything
            # leaves (the requests of one merged answer reach their next step together). No
            # timer: the turn ends as soon as the ready tasks have run.
            self.gathering = True
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self.gathering = False
                self.queue.remove(member)
                self._flush()  # the calls that joined must not wait for another caller
                raise
            self.gathering = False
            if self.queue == [member] and self._free():
                self.queue.clear()  # nobody joined: sent from this task, no merged-call task
                return await self._direct(send())
        self._flush()
        expiry = loop.call_later(timeout, expire, member.answer)
        try:
            return await member.answer
        except Expired:
            raise CallFailed(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded (in a merged call)"
            ) from None
        finally:
            expiry.cancel()
            self._leave(member)

    async def _direct(self, call: Awaitable[Tensors]) -> Tensors:
        """A call sent alone, from its caller's (running) task: its `finally` always runs."""
        token = next(tokens)
        self.calls.begin(token)
        child(metrics.MERGED_MEMBERS, self.label).observe(1)
        answered = False
        try:
            answer = await call
            answered = True
            return answer
        finally:
            self._ended(token, answered)

    def _leave(self, member: Member) -> None:
        answer = member.answer
        if answer.done() and not answer.cancelled() and answer.exception() is None:
            return  # answered by its merged call, which is ending: nothing to undo
        answer.cancel()  # a no-op once done
        if member.call is None:
            if member in self.queue:
                self.queue.remove(member)
        elif member.call.task is not None and all(m.answer.done() for m in member.call.members):
            member.call.task.cancel()  # nobody waits for it any more

    def _ended(self, token: int, answered: bool) -> None:
        age = self.calls.end(token)
        if answered:
            self.pace.observe(age)
        self._flush()

    def _merged_done(self, merged: Merged, task: asyncio.Task[None]) -> None:
        # For a task cancelled before it started: its `finally` settles every other at once.
        if merged.token in self.calls.started:
            self._settle(merged)
        merged.members = []
        merged.task = None

    def _settle(self, merged: Merged) -> None:
        answered = any(
            m.answer.done() and not m.answer.cancelled() and m.answer.exception() is None
            for m in merged.members
        )
        self._ended(merged.token, answered)

    def _flush(self) -> None:
        if self.gathering:
            return  # the lane's first caller sends what gathered when its turn ends
        while self.queue and self._free():
            taken: list[Member] = []
            rows = size = 0
            while self.queue:
                member = self.queue[0]
                if taken and (
                    rows + member.rows > self.max_rows or size + member.size > self.max_bytes
                ):
                    break
                self.queue.pop(0)
                if member.answer.done():
                    continue
                taken.append(member)
                rows += member.rows
                size += member.size
            if not taken:
                continue
            merged = Merged(taken)
            for member in taken:
                member.call = merged
            self.calls.begin(merged.token)
            merged.task = asyncio.create_task(self._send_merged(merged))
            merged.task.add_done_callback(functools.partial(self._merged_done, merged))
        if self.queue and self._wake is None:
            self._wake_when_stalled()

    def _wake_when_stalled(self) -> None:
        """Flush again when the oldest busy call turns stalled (a slot frees then)."""
        delay = self.calls.until_next_stall(time.monotonic(), self.pace.stall_after())
        if delay is None or len(self.calls) >= self.slots + MAX_STALLED:
            return  # an ending call flushes

        def wake() -> None:
            self._wake = None
            self._flush()

        self._wake = asyncio.get_running_loop().call_later(delay, wake)

    async def _send_merged(self, merged: Merged) -> None:
        try:
            with merged_span(merged.members):
                if not await deliver(merged.members, self._call, self.solo, self.halve):
                    self.solo = True  # answers without a row per request: never merge it
        except asyncio.CancelledError:
            for member in merged.members:
                fail(member, CallFailed(grpc.StatusCode.CANCELLED, "merged call cancelled"))
            raise
        except Exception as exc:  # a bug here must not leave members waiting
            for member in merged.members:
                fail(member, CallFailed(grpc.StatusCode.INTERNAL, f"merged call: {exc!r}"))
        finally:
            self._settle(merged)

    async def _call(self, members: list[Member]) -> Tensors:
        loop = asyncio.get_running_loop()
        timeout = max(m.deadline for m in members) - loop.time()
        if timeout <= 0:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        inputs = joined(members)
        extra = f"+{len(members) - 1}" if len(members) > 1 else ""
        child(metrics.MERGED_MEMBERS, self.label).observe(len(members))
        return await self.send(
            self.target,
            inputs,
            outputs=self.outputs,
            timeout=timeout,
            request_id=members[0].request_id + extra,
        )


class Merger:
    """The proxy's lanes, created on first use."""

    def __init__(self, send: Infer, max_message: int, slots: int = SLOTS) -> None:
        self._send = send
        self._max_bytes = int(max_message * HEADROOM)
        self._slots = slots
        self._lanes: dict[tuple, Lane] = {}

    def lane(
        self,
        label: str,
        target: Target,
        outputs: Sequence[str],
        inputs: Mapping[str, np.ndarray],
        max_batch: int,
        halve: frozenset[grpc.StatusCode] = HALVED,
    ) -> Lane:
        """The lane of this step's call with these inputs to a model taking `max_batch` rows."""
        lane = self._lanes.get(key := (label, target, tuple(outputs), signature(inputs)))
        if lane is None:
            if len(self._lanes) >= MAX_LANES:
                # Signatures vary with the inputs' sizes (e.g. a text line's width): idle
                # lanes go, so that their number stays bounded whatever the callers send.
                self._lanes = {k: v for k, v in self._lanes.items() if v.in_flight or v.queue}
            lane = self._lanes[key] = Lane(
                label, target, tuple(outputs), max_batch, self._max_bytes, self._send, self._slots
            )
        lane.max_rows, lane.halve = max_batch, halve  # a model reloaded is followed
        return lane
