"""The v2 services against callers who send what costs them most: a label per request
in their metrics, and streams written without reading the answers (issue 18)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from protos import messages, pb, pb_grpc
from protos.channels import channel_options
from tests.hostile.probe import memory_mb
from tests.procs import Service, start_service
from tests.report import report


@pytest.fixture(scope="module")
def service(test_repository: Path, workdir: Path) -> Iterator[Service]:
    """A predictor of its own, so its memory is this test's alone."""
    served = start_service("predictors", ["--repository", str(test_repository)], workdir)
    yield served
    served.stop()


def test_unknown_model_names_do_not_become_metric_labels(service: Service) -> None:
    """300 requests, each with a unique 256 KB model name and an input that does not parse:
    /metrics grew to 1.5 GB when each name was a label. (The name is looked up before any
    input is decoded, so each is NOT_FOUND, and costs no decoding.)"""
    with grpc.insecure_channel(service.address, options=channel_options()) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for i in range(300):
            request = pb.ModelInferRequest(model_name=f"{i:06d}" + "n" * 256_000)
            request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
            request.raw_input_contents.append(b"\x00" * 3)  # 3 bytes for 16
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics").read()
    report(f"\nhostile: 300 unique 256 KB model names: /metrics is {len(scrape)} bytes")
    assert len(scrape) < 256_000
    assert b'model=""' in scrape and b"nnnnnnnn" not in scrape


def test_a_stream_written_without_reading_holds_a_bounded_number_of_bytes(
    service: Service,
) -> None:
    """40 requests of 32 MB on one ModelStreamInfer, no answer read: the service reads on
    only while the stream holds under its 64 MB window, and a normal caller is served
    meanwhile. With the window counting messages only it took all 40 and grew by 1.9 GB
    (measured with --stream-window-mb and --max-inflight-mb set to 100000); gRPC's own
    buffers for answers it has accepted come on top of the window."""
    rows, length = 8, 500_000  # the `ragged` model: x [8, 500000, 2] FP32 = 32 MB
    x = np.ones((rows, length, 2), np.float32)
    lengths = np.full(rows, length, np.int32)
    big = messages.build_request("ragged", {"x": x, "lengths": lengths})
    sent = []

    def requests() -> Iterator[pb.ModelInferRequest]:
        for _ in range(40):
            sent.append(time.monotonic())
            yield big

    before = memory_mb(service.proc.pid)[1]
    with grpc.insecure_channel(service.address, options=channel_options(128)) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stream = stub.ModelStreamInfer(requests(), timeout=60)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            time.sleep(0.5)
        peak = memory_mb(service.proc.pid)[1] - before
        small = messages.build_request("linear", {"x": np.ones((1, 4), np.float32)})
        answer = stub.ModelInfer(small, timeout=10)
        stream.cancel()
    report(
        f"\nhostile: 40 x 32 MB on one stream, answers unread: {len(sent)} taken from the "
        f"client in 8 s, service peak memory +{peak:.0f} MiB"
    )
    assert messages.response_outputs(answer)["y"].shape == (1, 3)
    assert len(sent) < 20
    assert peak < 1024
