"""Triton's own load generator (perf_analyzer, C++) runs against our predictor unchanged:
it reads the model through ModelMetadata and ModelConfig, its server-side figures through
ModelStatistics, and sends tensors in the message or in system shared memory, by unary calls
or on ModelStreamInfer streams."""

from __future__ import annotations

import pytest

from bench import perf_analyzer
from protos import pb, pb_grpc
from tests.procs import Service


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    try:
        return perf_analyzer.environment()
    except perf_analyzer.Unavailable as exc:
        pytest.skip(str(exc))


def _counts(stub: pb_grpc.GRPCInferenceServiceStub) -> tuple[int, int]:
    reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name="linear", version="3"))
    stats = reply.model_stats[0].inference_stats
    return stats.success.count, stats.fail.count


@pytest.mark.parametrize(
    ("shared_memory", "streaming"),
    [(False, False), (True, False), (False, True)],
    ids=["in-message", "shared-memory", "streaming"],
)
def test_perf_analyzer_measures_our_predictor(
    predictor: Service,
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
    env: dict[str, str],
    shared_memory: bool,
    streaming: bool,
) -> None:
    ok_before, failed_before = _counts(predictor_stub)
    stats = perf_analyzer.measure(
        predictor.address,
        "linear",
        2,
        1.5,
        shared_memory=shared_memory,
        streaming=streaming,
        env=env,
    )
    ok, failed = _counts(predictor_stub)
    assert stats.rps > 0 and stats.p50_ms > 0
    # Its measured windows are part of what the server counted; nothing failed.
    assert ok - ok_before >= stats.requests > 0
    assert failed == failed_before
