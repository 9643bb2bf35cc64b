"""When a model's memory arena gives back what an execution took (predictors/arena.py)."""

from __future__ import annotations

from predictors.arena import WINDOW, Arena


def test_outliers_give_back_only_after_an_execution_far_larger_than_the_usual() -> None:
    arena = Arena("outliers")
    decided = [arena.run_options(size) is not None for size in (100, 120, 90, 100)]
    assert decided == [False] * 4  # the usual sizes keep what they grew
    assert arena.run_options(250) is not None  # over twice the largest seen
    assert arena.run_options(260) is None  # now among the usual: kept
    for _ in range(WINDOW):
        arena.run_options(100)
    assert arena.run_options(260) is not None  # the giant has left the window


def test_always_gives_back_after_every_execution() -> None:
    arena = Arena("always")
    assert all(arena.run_options(size) is not None for size in (100, 100, 1))
