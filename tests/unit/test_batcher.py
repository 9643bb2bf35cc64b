from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from protos.errors import DeadlineExceeded, InvalidInput, Overloaded, Unavailable
from v2server.batcher import Batcher


class Recorder:
    """A model that doubles its input and records every execution's row count."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.gate.wait(5)
        x = inputs["x"]
        self.batches.append(x.shape[0])
        if self.fail:
            raise RuntimeError("model exploded")
        return {"y": x * 2, "rowsum": x.sum(axis=1)}


@pytest.fixture
async def executor() -> AsyncIterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1)
    yield pool
    pool.shutdown(wait=False)


def make(
    run: Recorder,
    executor: ThreadPoolExecutor,
    *,
    rows: int = 8,
    delay: float = 0.05,
    queue: int = 100,
) -> Batcher:
    batcher = Batcher(
        run, executor, name="t", max_batch_rows=rows, max_delay_s=delay, max_queue=queue
    )
    batcher.start()
    return batcher


def x_of(rows: int, value: float, width: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, width), value, dtype=np.float32)}


async def test_concurrent_requests_merge_and_split_back(executor: ThreadPoolExecutor) -> None:
    run = Recorder()
    batcher = make(run, executor)
    sizes = [1, 3, 2, 1]
    results = await asyncio.gather(
        *(batcher.submit(x_of(n, i), n, None) for i, n in enumerate(sizes))
    )
    await batcher.stop()
    assert run.batches == [sum(sizes)]
    for i, (n, out) in enumerate(zip(sizes, results, strict=True)):
        assert out["y"].shape == (n, 3)
        np.testing.assert_array_equal(out["y"], np.full((n, 3), 2.0 * i))
        np.testing.assert_array_equal(out["rowsum"], np.full(n, 3.0 * i))


async def test_batches_never_exceed_max_rows(executor: ThreadPoolExecutor) -> None:
    run = Recorder()
    batcher = make(run, executor, rows=4)
    await asyncio.gather(*(batcher.submit(x_of(3, i), 3, None) for i in range(5)))
    await batcher.stop()
    assert sum(run.batches) == 15 and max(run.batches) <= 4


async def test_requests_with_other_row_shapes_are_not_merged(
    executor: ThreadPoolExecutor,
) -> None:
    run = Recorder()
    batcher = make(run, executor)
    a, b = await asyncio.gather(
        batcher.submit(x_of(1, 1, width=3), 1, None), batcher.submit(x_of(1, 1, width=5), 1, None)
    )
    await batcher.stop()
    assert sorted(run.batches) == [1, 1]
    assert a["y"].shape == (1, 3) and b["y"].shape == (1, 5)


async def test_zero_rows_setting_runs_each_request_alone(executor: ThreadPoolExecutor) -> None:
    run = Recorder()
    batcher = make(run, executor, rows=0)
    await asyncio.gather(*(batcher.submit(x_of(2, i), 0, None) for i in range(3)))
    await batcher.stop()
    assert run.batches == [2, 2, 2]


async def test_full_queue_answers_overloaded(executor: ThreadPoolExecutor) -> None:
    run = Recorder()
    run.gate.clear()
    batcher = make(run, executor, rows=1, delay=0, queue=2)
    first = asyncio.create_task(batcher.submit(x_of(1, 0), 1, None))
    await asyncio.sleep(0.05)  # the worker holds `first` inside the gated run
    queued = [asyncio.create_task(batcher.submit(x_of(1, i), 1, None)) for i in (1, 2)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="queue full"):
        await batcher.submit(x_of(1, 3), 1, None)
    run.gate.set()
    await asyncio.gather(first, *queued)
    await batcher.stop()


async def test_departed_caller_is_skipped_without_breaking_its_batch(
    executor: ThreadPoolExecutor,
) -> None:
    run = Recorder()
    run.gate.clear()
    batcher = make(run, executor, rows=8, delay=0.01)
    blocker = asyncio.create_task(batcher.submit(x_of(1, 0), 1, None))
    await asyncio.sleep(0.05)
    leaving = asyncio.create_task(batcher.submit(x_of(2, 1), 2, None))
    staying = asyncio.create_task(batcher.submit(x_of(1, 2), 1, None))
    await asyncio.sleep(0)
    leaving.cancel()
    run.gate.set()
    out = await staying
    await blocker
    await batcher.stop()
    np.testing.assert_array_equal(out["y"], np.full((1, 3), 4.0))
    assert run.batches == [1, 1], "the cancelled request's rows must not be run"


async def test_expired_deadline_is_not_run(executor: ThreadPoolExecutor) -> None:
    run = Recorder()
    run.gate.clear()
    batcher = make(run, executor, rows=8, delay=0.0)
    loop = asyncio.get_running_loop()
    blocker = asyncio.create_task(batcher.submit(x_of(1, 0), 1, None))
    await asyncio.sleep(0.05)
    late = asyncio.create_task(batcher.submit(x_of(5, 1), 5, loop.time() + 0.02))
    await asyncio.sleep(0.1)
    run.gate.set()
    with pytest.raises(DeadlineExceeded):
        await late
    await blocker
    await batcher.stop()
    assert run.batches == [1]


async def test_model_error_reaches_every_member_and_batcher_survives(
    executor: ThreadPoolExecutor,
) -> None:
    run = Recorder()
    batcher = make(run, executor)
    run.fail = True
    results = await asyncio.gather(
        *(batcher.submit(x_of(1, i), 1, None) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    run.fail = False
    out = await batcher.submit(x_of(1, 4), 1, None)
    await batcher.stop()
    np.testing.assert_array_equal(out["y"], np.full((1, 3), 8.0))


async def test_oversized_request_and_stop(executor: ThreadPoolExecutor) -> None:
    run = Recorder()
    run.gate.clear()
    batcher = make(run, executor, rows=4, delay=0)
    with pytest.raises(InvalidInput, match="exceeds max_batch_size 4"):
        await batcher.submit(x_of(5, 0), 5, None)
    running = asyncio.create_task(batcher.submit(x_of(1, 0), 1, None))
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(batcher.submit(x_of(1, 0), 1, None))
    await asyncio.sleep(0)
    stopping = asyncio.create_task(batcher.stop())
    await asyncio.sleep(0.05)
    run.gate.set()
    await stopping
    for task in (running, queued):
        with pytest.raises(Unavailable):
            await task
    with pytest.raises(Unavailable):
        await batcher.submit(x_of(1, 0), 1, None)


async def test_unbatched_path_is_bounded_and_checks_deadlines(
    executor: ThreadPoolExecutor,
) -> None:
    run = Recorder()
    run.gate.clear()
    batcher = make(run, executor, rows=0, queue=2)
    loop = asyncio.get_running_loop()
    running = asyncio.create_task(batcher.submit(x_of(1, 0), 0, None))
    await asyncio.sleep(0.05)
    late = asyncio.create_task(batcher.submit(x_of(1, 1), 0, loop.time() + 0.01))
    waiting = asyncio.create_task(batcher.submit(x_of(1, 2), 0, None))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="queue full"):
        await batcher.submit(x_of(1, 3), 0, None)
    await asyncio.sleep(0.05)
    run.gate.set()
    with pytest.raises(DeadlineExceeded):
        await late
    out = await waiting
    await running
    await batcher.stop()
    np.testing.assert_array_equal(out["y"], np.full((1, 3), 4.0))
    assert run.batches == [1, 1], "the late request must not be run"


async def test_cheap_executions_run_on_the_loop_expensive_ones_do_not(
    executor: ThreadPoolExecutor,
) -> None:
    threads: list[str] = []

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        threads.append(threading.current_thread().name)
        if inputs["x"].shape[0] > 1:
            time.sleep(0.02)
        return {"y": inputs["x"]}

    batcher = Batcher(
        run, executor, name="t", max_batch_rows=0, max_delay_s=0, max_queue=10, inline_below_s=0.001
    )
    batcher.start()
    batcher.seed(0.0001)
    await batcher.submit(x_of(1, 0), 0, None)  # cheap: on the loop
    await batcher.submit(x_of(2, 0), 0, None)  # still looks cheap; takes 20 ms
    await batcher.submit(x_of(2, 0), 0, None)  # the average now says expensive: a thread
    big = {"x": np.zeros((1, 1 << 15), np.float32)}  # over the inline size limit
    batcher.seed(0.0001)
    await batcher.submit(big, 0, None)
    await batcher.stop()
    loop_thread = threading.current_thread().name
    assert threads[0] == threads[1] == loop_thread
    assert threads[2] != loop_thread and threads[3] != loop_thread


async def test_low_load_stops_waiting_and_high_load_batches_again(
    executor: ThreadPoolExecutor,
) -> None:
    """One caller at a time: after a few single batches the batcher stops holding requests
    for company (each would otherwise wait the whole delay), and does not start again once
    its requests, answered at once, come closer together than the delay (they were held
    again from the ~10th on: a predictor called so answered in 1.06 ms, 0.62 unbatched);
    a burst then merges again."""
    run = Recorder()
    delay = 0.3
    batcher = make(run, executor, rows=64, delay=delay)
    took = []
    for i in range(24):
        start = time.perf_counter()
        await batcher.submit(x_of(1, i), 1, None)
        took.append(time.perf_counter() - start)
    assert all(t >= delay * 0.9 for t in took[:1]), took  # a new batcher waits, as configured
    assert all(t < delay / 2 for t in took[-20:]), took  # ...but not once it sees low load
    assert run.batches == [1] * 24
    await asyncio.gather(*(batcher.submit(x_of(1, i), 1, None) for i in range(16)))
    await batcher.stop()
    burst = run.batches[24:]
    assert sum(burst) == 16 and len(burst) < 16, burst


async def test_two_callers_one_request_at_a_time_keep_each_other_company(
    executor: ThreadPoolExecutor,
) -> None:
    """Two callers, each sending its next request once answered: a batch held open for
    company finds the other's, so the batcher keeps waiting (what it stops doing for one
    caller alone)."""
    run = Recorder()
    batcher = make(run, executor, rows=64, delay=0.05)

    async def caller(first: int) -> None:
        for i in range(12):
            await batcher.submit(x_of(1, first + i), 1, None)

    await asyncio.gather(caller(0), caller(100))
    await batcher.stop()
    assert sum(run.batches) == 24
    assert run.batches.count(2) >= 9, run.batches


async def test_stop_answers_a_batch_waiting_for_a_busy_slot(executor: ThreadPoolExecutor) -> None:
    run = Recorder()
    batcher = make(run, executor, rows=4, delay=0)
    for i in range(6):  # single batches: the batcher stops waiting and runs idle calls inline
        await batcher.submit(x_of(1, i), 1, None)
    run.gate.clear()
    alone = asyncio.create_task(batcher.submit(x_of(1, 0), 1, None))  # holds the one slot
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(batcher.submit(x_of(1, 1), 1, None))  # batch waits for it
    await asyncio.sleep(0.05)
    stopping = asyncio.create_task(batcher.stop())
    await asyncio.sleep(0.05)
    run.gate.set()
    await stopping
    assert (await alone)["y"].shape == (1, 3)
    with pytest.raises(Unavailable):
        await asyncio.wait_for(queued, 2)
