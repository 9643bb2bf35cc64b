"""Request ids reach logs only when short and plain (protos/logs.py): a door request `id`
of 20 MiB was once logged as it was and grew the log by 120 MiB; REST's X-Request-Id had the
rule already, the gRPC services and door now share it."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest
from grpc import aio

from protos import messages, pb_grpc
from protos.logs import REQUEST_ID, new_id, plain_id
from proxy.jobs.model import new_id as job_id
from tests.proxy.scripted import ScriptedModel, serve


def test_plain_ids_are_kept_and_others_replaced() -> None:
    assert plain_id("req-1.2:3+4") == "req-1.2:3+4"
    assert plain_id(b"abc_DEF") == "abc_DEF"
    assert plain_id("batch-zeros/0001%20a.png") == "batch-zeros/0001%20a.png"  # mesh batch's
    for bad in ("x" * 129, "a b", "", "é", "a\nb"):
        replaced = plain_id(bad)
        assert replaced != bad and len(replaced) == 32 and int(replaced, 16) >= 0


@pytest.mark.parametrize("new_id", [new_id, job_id], ids=["request", "job"])
def test_new_ids_differ_within_a_process_and_across_a_fork(new_id: Callable[[], str]) -> None:
    """Request ids: a counter after a per-process prefix; job ids: drawn from the OS's
    CSPRNG 256 at a time. A forked worker draws its own prefix, or empties the ids drawn,
    or it would hand out its parent's next ids."""
    new_id()  # the job ids' first draw made before the fork
    here = [new_id() for _ in range(1000)]
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only reports its ids
        os.write(write_end, "".join(new_id() for _ in range(1000)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(child, 0)
    there = [text[i : i + 32] for i in range(0, len(text), 32)]
    assert len(there) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in here + there)
    assert len(set(here + there + [new_id() for _ in range(1000)])) == 3000


async def test_a_service_logs_a_huge_request_id_as_a_new_short_one() -> None:
    seen: list[str] = []

    async def fn(inputs, deadline):
        seen.append(REQUEST_ID.get())
        return {"y": inputs["x"]}

    server = await serve(ScriptedModel("m", fn))
    huge = "x" * (1 << 20)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = {"x": np.ones((1, 2), np.float32)}
            for request_id in ("plain-1", huge):
                answer = await stub.ModelInfer(
                    messages.build_request("m", x, request_id=request_id)
                )
                assert answer.id == request_id  # the protocol echoes it to the caller
    finally:
        await server.stop(0)
    assert seen[0] == "plain-1"
    assert len(seen[1]) == 32 and seen[1] != huge


def test_job_ids_are_uuid7_in_the_order_jobs_came() -> None:
    """Time first, so that SQLite's index of ids takes each new job at its end (random ids
    made its store 1.7x as costly a job); then random bits, so that an id is not guessed."""
    first = job_id()
    time.sleep(0.002)
    later = [job_id() for _ in range(100)]
    assert all(uuid.UUID(i).version == 7 for i in [first, *later])
    assert all(first < i for i in later)
    assert len({i[-16:] for i in later}) == 100  # the random part differs within a millisecond
