"""Behaviour specific to this project's predictor (versions, datatypes, batching, shutdown)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import codec, messages, pb, pb_grpc
from protos.channels import channel_options
from tests.modelgen import SLOW_WIDTH, TYPES, linear_weights
from tests.procs import Service, metric, run_module, start_service
from v2server.policy import PROBE_S
from v2server.streaming import STREAM_WINDOW

TIMEOUT = 10.0


def infer(stub, model: str, inputs: dict, version: str = "", timeout: float = TIMEOUT) -> dict:
    response = stub.ModelInfer(
        messages.build_request(model, inputs, model_version=version), timeout=timeout
    )
    return messages.response_outputs(response)


def linear_expected(x: np.ndarray, version: int) -> np.ndarray:
    w, b = linear_weights(version)
    return x @ w + b


def test_version_policy_loads_latest_two(predictor_stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    meta = predictor_stub.ModelMetadata(pb.ModelMetadataRequest(name="linear"))
    assert list(meta.versions) == ["2", "3"]
    assert meta.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 4])]


@pytest.mark.parametrize(("version", "expected"), [("", 3), ("2", 2), ("3", 3)])
def test_request_selects_version(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub, version: str, expected: int
) -> None:
    x = np.random.default_rng(5).normal(size=(3, 4)).astype(np.float32)
    out = infer(predictor_stub, "linear", {"x": x}, version=version)
    np.testing.assert_allclose(out["y"], linear_expected(x, expected), rtol=1e-5)
    np.testing.assert_array_equal(out["label"], linear_expected(x, expected).argmax(axis=1))


def test_unloaded_version_is_not_found_and_not_ready(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        infer(predictor_stub, "linear", {"x": np.zeros((1, 4), np.float32)}, version="1")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "loaded: 2, 3" in (info.value.details() or "")
    ready = predictor_stub.ModelReady(pb.ModelReadyRequest(name="linear", version="1"))
    assert ready.ready is False


def _sample(name: str) -> np.ndarray:
    if name == "s":
        return np.array([b"", b"caf\xc3\xa9", b"x" * 300], dtype=object)
    dtype = codec.DATATYPE_TO_DTYPE[
        {"b": "BOOL", "f16": "FP16", "f32": "FP32", "f64": "FP64"}.get(
            name, name.replace("u", "UINT").replace("i", "INT")
        )
    ]
    if dtype.kind == "b":
        return np.array([True, False, True])
    if dtype.kind == "f":
        return np.array([-1.5, 0.0, 65504.0], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([info.min, 0, info.max], dtype=dtype)


def test_every_datatype_round_trips_raw(predictor_stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    inputs = {name: _sample(name) for name in TYPES}
    out = infer(predictor_stub, "types", inputs)
    for name, arr in inputs.items():
        np.testing.assert_array_equal(out[f"out_{name}"], arr)
        assert out[f"out_{name}"].dtype == arr.dtype


def test_typed_contents_are_accepted(predictor_stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    inputs = {name: _sample(name) for name in TYPES}
    request = pb.ModelInferRequest(model_name="types")
    for name, arr in inputs.items():
        datatype = codec.datatype_of(arr)
        tensor = request.inputs.add(name=name, datatype=datatype, shape=arr.shape)
        if datatype == "FP16":
            continue  # FP16 has no typed field: filled below as raw is not allowed to mix
        getattr(tensor.contents, codec.CONTENTS_FIELD[datatype]).extend(arr.tolist())
    # FP16 cannot travel as typed contents; the server must say so, naming the tensor.
    with pytest.raises(grpc.RpcError) as info:
        predictor_stub.ModelInfer(request, timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'f16'" in (info.value.details() or "")
    # Without FP16 every typed field is decoded: route it through a model-less check.
    del request.inputs[[t.name for t in request.inputs].index("f16")]
    request.inputs.add(name="f16", datatype="FP16", shape=[0])
    with pytest.raises(grpc.RpcError) as info:
        predictor_stub.ModelInfer(request, timeout=TIMEOUT)
    assert "'f16'" in (info.value.details() or "")


def test_typed_contents_infer(predictor_stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    request = pb.ModelInferRequest(model_name="linear", model_version="2")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4]).contents.fp32_contents.extend(
        x.ravel().tolist()
    )
    out = messages.response_outputs(predictor_stub.ModelInfer(request, timeout=TIMEOUT))
    np.testing.assert_allclose(out["y"], linear_expected(x, 2), rtol=1e-5)


def test_coalesced_batch_equals_single_requests(
    predictor: Service, predictor_stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    rng = np.random.default_rng(11)
    xs = [rng.normal(size=(int(rng.integers(1, 4)), 4)).astype(np.float32) for _ in range(48)]
    singles = [infer(predictor_stub, "linear", {"x": x}) for x in xs]
    # One client's requests one at a time taught the batcher that waiting finds no company;
    # it tries again after PROBE_S (v2server/policy.py), and the burst then merges.
    time.sleep(PROBE_S)
    executions_before = metric(predictor.metrics_port, "v2_batch_rows_count", model="linear")
    stats_before = statistics(predictor_stub, "linear", "3")
    futures = [
        predictor_stub.ModelInfer.future(
            messages.build_request("linear", {"x": x}), timeout=TIMEOUT
        )
        for x in xs
    ]
    batched = [messages.response_outputs(f.result()) for f in futures]
    executions = (
        metric(predictor.metrics_port, "v2_batch_rows_count", model="linear") - executions_before
    )
    for single, merged in zip(singles, batched, strict=True):
        np.testing.assert_array_equal(single["y"], merged["y"])
        np.testing.assert_array_equal(single["label"], merged["label"])
    assert executions < len(xs), f"{executions} executions for {len(xs)} requests: no coalescing"
    # Triton's statistics tell the same story: requests, rows, executions by batch size.
    stats = statistics(predictor_stub, "linear", "3")
    rows = sum(len(x) for x in xs)
    assert stats.inference_stats.success.count - stats_before.inference_stats.success.count == 48
    assert stats.inference_stats.queue.count - stats_before.inference_stats.queue.count == 48
    assert stats.inference_count - stats_before.inference_count == rows
    assert stats.execution_count - stats_before.execution_count == executions
    by_size = _batch_counts(stats)
    for size, count in _batch_counts(stats_before).items():
        by_size[size] -= count
    assert sum(by_size.values()) == executions
    assert sum(size * count for size, count in by_size.items()) == rows
    assert max(by_size) > 3, f"no batch merged requests: {by_size}"


def statistics(
    stub: pb_grpc.GRPCInferenceServiceStub, model: str, version: str
) -> pb.ModelStatistics:
    reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model, version=version))
    (stats,) = reply.model_stats
    assert (stats.name, stats.version) == (model, version)
    return stats


def _batch_counts(stats: pb.ModelStatistics) -> dict[int, int]:
    return {b.batch_size: b.compute_infer.count for b in stats.batch_stats}


def test_model_config_reports_batching_and_per_row_shapes(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    config = predictor_stub.ModelConfig(pb.ModelConfigRequest(name="linear")).config
    assert (config.name, config.platform, config.backend) == (
        "linear",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert config.max_batch_size == 16
    # Triton's convention: with max_batch_size > 0 the batch dimension is left out.
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("x", pb.TYPE_FP32, [4])]
    # A row of one element: dims [1] reshaped to [] (Triton's convention, never no dims).
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("y", pb.TYPE_FP32, [3]),
        ("label", pb.TYPE_INT64, [1]),
    ]
    assert config.output[1].HasField("reshape") and not config.output[1].reshape.shape
    # config.yaml's honoured fields, as Triton writes them.
    assert config.output[0].label_filename == "labels.txt" and not config.output[1].label_filename
    assert config.version_policy.latest.num_versions == 2
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 256
    assert config.dynamic_batching.max_queue_delay_microseconds == 20_000
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (pb.ModelInstanceGroup.KIND_CPU, 1)
    ]
    plain = predictor_stub.ModelConfig(pb.ModelConfigRequest(name="types")).config
    assert plain.max_batch_size == 0 and not plain.HasField("dynamic_batching")
    assert {i.name: list(i.dims) for i in plain.input}["f32"] == [-1]
    assert {i.name: i.data_type for i in plain.input}["s"] == pb.TYPE_STRING
    with pytest.raises(grpc.RpcError) as info:
        predictor_stub.ModelConfig(pb.ModelConfigRequest(name="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_statistics_count_failures_and_list_versions(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    before = statistics(predictor_stub, "linear", "2")
    infer(predictor_stub, "linear", {"x": np.zeros((2, 4), np.float32)}, version="2")
    with pytest.raises(grpc.RpcError):
        infer(predictor_stub, "linear", {"x": np.zeros((1, 5), np.float32)}, version="2")
    after = statistics(predictor_stub, "linear", "2")
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert after.inference_stats.success.ns > before.inference_stats.success.ns
    assert after.inference_count == before.inference_count + 2
    assert after.last_inference >= before.last_inference > 0
    every = predictor_stub.ModelStatistics(pb.ModelStatisticsRequest(name="linear"))
    assert [(m.name, m.version) for m in every.model_stats] == [("linear", "2"), ("linear", "3")]
    everything = predictor_stub.ModelStatistics(pb.ModelStatisticsRequest())
    assert {m.name for m in everything.model_stats} == {"linear", "ragged", "slow", "types"}
    for name, version in (("nope", ""), ("linear", "1")):
        with pytest.raises(grpc.RpcError) as info:
            predictor_stub.ModelStatistics(pb.ModelStatisticsRequest(name=name, version=version))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_batch_larger_than_max_batch_size_is_invalid(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        infer(predictor_stub, "linear", {"x": np.zeros((17, 4), np.float32)})
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_batch_size 16" in (info.value.details() or "")


def test_grpc_health_service(predictor: Service) -> None:
    with grpc.insecure_channel(predictor.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_metrics_count_requests_by_code(
    predictor: Service, predictor_stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    def count(code: str) -> float:
        return metric(
            predictor.metrics_port,
            "v2_requests_total",
            method="ModelInfer",
            model="linear",
            code=code,
        )

    ok_before, bad_before = count("OK"), count("INVALID_ARGUMENT")
    infer(predictor_stub, "linear", {"x": np.zeros((1, 4), np.float32)})
    with pytest.raises(grpc.RpcError):
        infer(predictor_stub, "linear", {"x": np.zeros((1, 5), np.float32)})
    assert count("OK") == ok_before + 1
    assert count("INVALID_ARGUMENT") == bad_before + 1


def test_sigterm_finishes_in_flight_then_refuses(test_repository: Path, workdir: Path) -> None:
    service = start_service(
        "predictors",
        ["--repository", str(test_repository), "--models", "slow", "--grace-s", "20"],
        workdir,
    )
    with grpc.insecure_channel(service.address, options=channel_options()) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        x = np.ones((64, SLOW_WIDTH), np.float32)
        t0 = time.perf_counter()
        infer(stub, "slow", {"x": x})
        single_s = time.perf_counter() - t0
        # Enough rows, and calls queued behind one another (one instance), that some are
        # still running when SIGTERM lands, however fast the machine.
        rows = int(min(4096, max(256, 64 * 2.0 / max(single_s, 1e-3))))
        request = messages.build_request("slow", {"x": np.ones((rows, SLOW_WIDTH), np.float32)})
        in_flight = [stub.ModelInfer.future(request, timeout=60) for _ in range(8)]
        time.sleep(0.2)
        running = [f for f in in_flight if not f.done()]
        assert running, "the slow calls finished before SIGTERM; test is void"
        stopper = threading.Thread(target=service.stop, kwargs={"sig": signal.SIGTERM})
        stopper.start()
        finished = 0
        for future in running:
            try:
                out = messages.response_outputs(future.result())
            except grpc.RpcError as exc:
                # A call still on its way when SIGTERM landed is refused, never dropped.
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert "shutting down" in (exc.details() or "")
                continue
            assert out["y"].shape == (rows, SLOW_WIDTH)
            finished += 1
        assert finished >= 1, "no call in flight at SIGTERM was finished"
        stopper.join(30)
    assert service.proc.returncode == 0, service.log()
    assert '"msg": "shutting down"' in service.log()
    with grpc.insecure_channel(service.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ServerLive(pb.ServerLiveRequest(), timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_bad_model_config_fails_start_naming_the_file(
    tmp_path: Path, test_repository: Path
) -> None:
    broken = tmp_path / "repo" / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.onnx").write_bytes(
        (test_repository / "linear/3/model.onnx").read_bytes()
    )
    (broken / "config.yaml").write_text(yaml.safe_dump({"max_batch_size": -3}))
    result = run_module("predictors", ["--repository", str(tmp_path / "repo"), "--port", "0"])
    assert result.returncode == 2
    assert "broken/config.yaml" in result.stderr and "max_batch_size" in result.stderr


def test_corrupt_onnx_fails_start_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "repo" / "junk" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "junk" / "1" / "model.onnx").write_bytes(b"not a model")
    result = run_module("predictors", ["--repository", str(tmp_path / "repo"), "--port", "0"])
    assert result.returncode == 2
    assert "junk/1/model.onnx" in result.stderr and "cannot load" in result.stderr


def test_classification_extension_uses_labels(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    x = np.random.default_rng(9).normal(size=(2, 4)).astype(np.float32)
    request = messages.build_request("linear", {"x": x}, model_version="2")
    wanted = request.outputs.add(name="y")
    wanted.parameters["classification"].int64_param = 2
    out = messages.response_outputs(predictor_stub.ModelInfer(request, timeout=TIMEOUT))["y"]
    scores = linear_expected(x, 2)
    assert out.shape == (2, 2)
    for row, got in zip(scores, out, strict=True):
        best = np.argsort(-row)[:2]
        names = ["cat", "dog", "emu"]
        assert [g.decode().split(":")[1:] for g in got] == [[str(i), names[i]] for i in best]
        assert float(got[0].decode().split(":")[0]) == pytest.approx(row[best[0]], rel=1e-4)


def test_stream_answers_every_request_and_survives_failures(
    predictor: Service, predictor_stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    """ModelStreamInfer: one stream, many requests, each answered once by id; a bad one
    gets its error_message and the rest go on; counted like unary calls."""
    rng = np.random.default_rng(3)
    xs = {f"r{i}": rng.normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(24)}
    requests = [messages.build_request("linear", {"x": x}, request_id=i) for i, x in xs.items()]
    requests.insert(
        5,
        messages.build_request(
            "linear", {"x": np.zeros((1, 5), np.float32)}, request_id="bad-shape"
        ),
    )
    requests.insert(9, messages.build_request("nope", {"x": xs["r0"]}, request_id="bad-model"))
    streamed_before = metric(
        predictor.metrics_port, "v2_requests_total", method="ModelStreamInfer", model="linear"
    )
    answers = list(predictor_stub.ModelStreamInfer(iter(requests), timeout=TIMEOUT))
    assert len(answers) == len(requests)
    by_id = {a.infer_response.id: a for a in answers}
    assert set(by_id) == {r.id for r in requests}
    assert "'x'" in by_id["bad-shape"].error_message
    assert "nope" in by_id["bad-model"].error_message
    for request_id, x in xs.items():
        answer = by_id[request_id]
        assert answer.error_message == ""
        out = messages.response_outputs(answer.infer_response)
        np.testing.assert_allclose(out["y"], linear_expected(x, 3), rtol=1e-5)
    streamed = metric(
        predictor.metrics_port, "v2_requests_total", method="ModelStreamInfer", model="linear"
    )
    assert streamed - streamed_before == len(xs) + 1  # the unknown model is not labelled


def test_stream_longer_than_its_window_is_answered_in_full(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    x = np.ones((1, 4), np.float32)
    count = 3 * STREAM_WINDOW
    requests = (messages.build_request("linear", {"x": x}, request_id=str(i)) for i in range(count))
    answers = list(predictor_stub.ModelStreamInfer(requests, timeout=30))
    assert sorted(int(a.infer_response.id) for a in answers) == list(range(count))
    assert not any(a.error_message for a in answers)


def test_cancelled_stream_leaves_the_server_serving(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    x = np.ones((256, SLOW_WIDTH), np.float32)
    requests = [messages.build_request("slow", {"x": x}, request_id=f"s{i}") for i in range(3)]
    call = predictor_stub.ModelStreamInfer(iter(requests), timeout=TIMEOUT)
    call.cancel()
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    out = infer(predictor_stub, "linear", {"x": np.zeros((1, 4), np.float32)})
    assert out["y"].shape == (1, 3)
    answers = list(predictor_stub.ModelStreamInfer(iter(requests[:1]), timeout=TIMEOUT))
    assert [a.infer_response.id for a in answers] == ["s0"] and not answers[0].error_message


def test_request_timeout_parameter_bounds_a_streamed_request(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    """Triton's `timeout` parameter (microseconds): a request still queued behind a long
    one when it runs out is answered DEADLINE_EXCEEDED, not run; the stream goes on."""
    long = messages.build_request(
        "slow", {"x": np.ones((1024, SLOW_WIDTH), np.float32)}, request_id="long"
    )
    short = messages.build_request(
        "slow", {"x": np.ones((1, SLOW_WIDTH), np.float32)}, request_id="short"
    )
    short.parameters["timeout"].int64_param = 1
    answers = {
        a.infer_response.id: a
        for a in predictor_stub.ModelStreamInfer(iter([long, short]), timeout=60)
    }
    assert answers["long"].error_message == ""
    assert "deadline passed" in answers["short"].error_message
    short.parameters["timeout"].string_param = "soon"
    with pytest.raises(grpc.RpcError) as info:
        predictor_stub.ModelInfer(short, timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'timeout'" in (info.value.details() or "")


def test_repository_index_lists_loaded_versions(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    index = predictor_stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=TIMEOUT)
    listed = {(m.name, m.version, m.state) for m in index.models}
    assert listed == {
        ("linear", "2", "READY"),
        ("linear", "3", "READY"),
        ("ragged", "1", "READY"),
        ("slow", "1", "READY"),
        ("types", "1", "READY"),
    }


def test_start_up_objects_are_set_aside_from_the_collector(predictor: Service) -> None:
    """A started service freezes what start-up made (protos/heap.py): a full collection then
    walks its requests' objects, not ~100,000 of modules and models (~65 ms of a stalled
    loop each, the largest share of the p99 before). Frozen right after the server starts."""
    deadline = time.monotonic() + 10
    while (frozen := metric(predictor.metrics_port, "python_gc_frozen_objects")) == 0:
        assert time.monotonic() < deadline, "the service never froze its start-up objects"
        time.sleep(0.1)
    assert frozen > 10_000  # modules, grpc, numpy, onnxruntime's bindings


@pytest.mark.parametrize("which", ["--port", "--metrics-port"])
def test_a_port_in_use_fails_start_naming_it(test_repository: Path, which: str) -> None:
    # Not a traceback: `./mesh up` shows the failed service's last lines, and CI lost a run
    # to a clash it took a log of shutdowns to find.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        other = {"--port": "--metrics-port", "--metrics-port": "--port"}[which]
        args = ["--repository", str(test_repository), which, str(port), other, "0"]
        done = run_module("predictors", args)
    assert done.returncode == 2, done.stderr
    assert "cannot start: cannot serve" in done.stderr and f"127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
