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


def test_unary_calls_sent_together_are_read_only_while_the_bound_has_room(
    test_repository: Path, workdir: Path
) -> None:
    """24 unary calls of 32 MB sent at once to a service bounded at 64 MB: each is read only
    when the bound has room for it, so the service holds about one at a time and answers them
    all in turn. A unary handler was given its message already received: 40 calls of 19 MB
    took a recogniser bounded at 128 MB from 133 to 1,093 MiB, and most were refused."""
    bounded = start_service(
        "predictors",
        ["--repository", str(test_repository), "--max-inflight-mb", "64"],
        workdir,
    )
    rows, length = 8, 500_000  # the `ragged` model: x [8, 500000, 2] FP32 = 32 MB
    x = np.ones((rows, length, 2), np.float32)
    big = messages.build_request(
        "ragged", {"x": x, "lengths": np.full(rows, length, np.int32)}, outputs=["total"]
    )
    small = messages.build_request("linear", {"x": np.ones((1, 4), np.float32)})
    try:
        before = memory_mb(bounded.proc.pid)[1]
        with grpc.insecure_channel(bounded.address, options=channel_options(64)) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            calls = [stub.ModelInfer.future(big, timeout=120) for _ in range(24)]
            time.sleep(1)  # the calls have been sent; most wait to be read
            answer = stub.ModelInfer(small, timeout=30)  # waits its turn, like the others
            totals = [messages.response_outputs(c.result())["total"] for c in calls]
        peak = memory_mb(bounded.proc.pid)[1] - before
    finally:
        bounded.stop()
    report(f"\nhostile: 24 unary calls of 32 MB at once, bound 64 MB: peak +{peak:.0f} MiB")
    assert messages.response_outputs(answer)["y"].shape == (1, 3)
    assert all(np.array_equal(t, np.full((rows, 2), length, np.float32)) for t in totals)
    assert peak < 400  # each call held on arrival: 24 x 32 MB = 768 MB and more
