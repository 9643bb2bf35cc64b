"""The gRPC door behind its nginx front (proxy/doors/grpc_front_nginx.py), against the
mesh's real services: the front answers every call as the grpc.aio door alone does (the same
proxy's door, reached on its own port), streams and metadata pass through it, a caller that
hangs up cancels its pipeline, and nginx lives and dies with the proxy. In CI nginx must be
there (./mesh test installs it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from protos import messages, pb, pb_grpc
from proxy.doors import grpc_front_nginx as nginx
from proxy.doors.grpc_front_nginx import front_pids
from proxy.settings import ProxySettings
from samples.text import suite
from tests.conftest import Mesh
from tests.hostile.test_front_door import digit
from tests.procs import ROOT

REST, FRONT, DOOR = 27880, 27881, 27882
"""The second proxy's ports: REST, the front (the door's public port), the door behind it."""


@pytest.fixture(scope="module")
def fronted(mesh: Mesh) -> Iterator[Mesh]:
    if nginx.binary(ProxySettings()) is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the gRPC front's tests: nginx is missing (./mesh test)")
        pytest.skip("nginx is not installed")
    env = {"PROXY_GRPC_PORT": str(FRONT), "PROXY_GRPC_DOOR_PORT": str(DOOR)}
    with mesh.extra_proxy(REST, PROXY_GRPC_FRONT="nginx", **env):
        yield mesh


def _stub(port: int) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _outcome(
    port: int, request: pb.ModelInferRequest, compression: grpc.Compression | None = None
) -> tuple:
    """What a caller sees: the answer's outputs, or the status, message and http-status."""
    for stub in _stub(port):
        try:
            answer = stub.ModelInfer(request, timeout=30, compression=compression)
        except grpc.RpcError as exc:
            http = dict(exc.trailing_metadata() or ()).get("http-status")
            return exc.code(), exc.details(), http
        outputs = messages.response_outputs(answer)
        return answer.model_name, {k: v.tolist() for k, v in outputs.items()}
    raise AssertionError


def _image_request(model: str, blob: bytes, datatype: str = "BYTES") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="image", datatype=datatype, shape=[1])
    request.raw_input_contents.append(len(blob).to_bytes(4, "little") + blob)
    return request


def _cases() -> dict[str, pb.ModelInferRequest]:
    wrong_output = _image_request("digits", digit())
    wrong_output.outputs.add(name="nosuch")
    return {
        "digits": _image_request("digits", digit()),
        "a model the pipeline calls": pb.ModelInferRequest.FromString(
            messages.build_request_bytes("digits_logreg", {"input": np.zeros((1, 64), np.float32)})
        ),
        "unknown model": _image_request("nosuch", digit()),
        "wrong datatype": _image_request("digits", digit(), "FP32"),
        "not an image": _image_request("digits", b"not an image at all"),
        "unknown output": wrong_output,
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_the_front_answers_as_the_door_alone(fronted: Mesh, case: str) -> None:
    request = _cases()[case]
    through, alone = _outcome(FRONT, request), _outcome(DOOR, request)
    assert through == alone
    if case.startswith(("digits", "a model")):
        assert not isinstance(through[0], grpc.StatusCode), through


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_a_compressed_call_is_answered_through_the_front(
    fronted: Mesh, compression: grpc.Compression
) -> None:
    """As tritonclient's `compression_algorithm` sends it: the front once refused it
    (INVALID_ARGUMENT) where the grpc.aio door alone inflates it."""
    # A BMP, which compresses (gRPC sends a message that would not shrink uncompressed).
    bmp = cv2.imencode(".bmp", cv2.imdecode(np.frombuffer(digit(), np.uint8), 0))[1].tobytes()
    request = _image_request("digits", bmp)
    through, alone = _outcome(FRONT, request, compression), _outcome(DOOR, request, compression)
    assert through == alone == _outcome(FRONT, request)
    assert through[0] == "digits", through


def test_metadata_and_streams_pass_through_the_front(fronted: Mesh) -> None:
    for stub in _stub(FRONT):
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="digits"), timeout=10)
        assert [t.name for t in meta.inputs] == ["image"]
        requests = [_image_request("digits", digit()) for _ in range(3)]
        for i, request in enumerate(requests):
            request.id = f"s{i}"
        answers = list(stub.ModelStreamInfer(iter(requests), timeout=30))
        assert sorted(a.infer_response.id for a in answers) == ["s0", "s1", "s2"]
        assert all(not a.error_message for a in answers)


def _ocr_calls(code: str) -> float:
    """The proxy's v2 ModelInfer calls of `ocr` that ended with `code`."""
    text = httpx.get(f"http://127.0.0.1:{REST}/metrics", timeout=10).text
    wanted = {"method": "ModelInfer", "model": "ocr", "code": code}
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "v2_requests_total" and wanted.items() <= sample.labels.items()
    )


def test_a_caller_that_hangs_up_cancels_its_pipeline(fronted: Mesh) -> None:
    """A page that takes seconds, its call cancelled by the caller after 0.5 s of a 60 s
    budget: the caller resets its stream, nginx closes the call's upstream connection, and
    the proxy cancels the page's calls (CANCELLED, never run to its end)."""
    photos = suite(3, seed=3, categories=["photo", "page"])
    request = _image_request("ocr", max((s.image for s in photos), key=len))
    before = {code: _ocr_calls(code) for code in ("OK", "CANCELLED")}
    for stub in _stub(FRONT):
        call = stub.ModelInfer.future(request, timeout=60)
        time.sleep(0.5)
        assert call.cancel(), "the page was answered within 0.5 s: pick a slower one"
    deadline = time.monotonic() + 10
    while _ocr_calls("CANCELLED") == before["CANCELLED"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ocr_calls("CANCELLED") == before["CANCELLED"] + 1
    time.sleep(3)  # longer than the page takes: it would have ended OK by now
    assert _ocr_calls("OK") == before["OK"], "the page ran to its end for nobody"


def _proxy(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "proxy"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_nginx_dies_with_the_proxy_and_is_required_when_asked_for(mesh: Mesh) -> None:
    if nginx.binary(ProxySettings()) is None and not os.environ.get("CI"):
        pytest.skip("nginx is not installed")
    base = {**os.environ, **mesh.local.services["proxy"].env, "PROXY_PORT": "27890"}
    env = {**base, "PROXY_GRPC_PORT": "27891", "PROXY_GRPC_FRONT": "nginx"}
    proxy = _proxy(env)
    try:
        deadline = time.monotonic() + 30
        while not (fronts := front_pids(proxy.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fronts, "no nginx under the proxy"
        proxy.send_signal(signal.SIGKILL)
        proxy.wait(10)
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in fronts):
            assert time.monotonic() < deadline, "nginx outlived its proxy"
            time.sleep(0.05)
    finally:
        proxy.kill()
        proxy.wait()
        proxy.stderr.close()  # type: ignore[union-attr]
    missing = _proxy({**env, "PROXY_GRPC_FRONT_NGINX": "/nonexistent/nginx"})
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 2 and "'/nonexistent/nginx' is not found" in err


def _client_ports(port: int) -> set[int]:
    """Local ports of this machine's established TCP connections to `port` (gRPC's sockets
    are IPv6 ones with IPv4-mapped addresses: both tables)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def test_a_channel_keeps_its_connection_past_a_thousand_calls(fronted: Mesh) -> None:
    """nginx closes an HTTP/2 connection after `keepalive_requests` (1,000 by default): a
    gRPC channel would reconnect every thousand calls, and calls racing the GOAWAY fail."""
    for stub in _stub(FRONT):
        stub.ServerLive(pb.ServerLiveRequest(), timeout=10)
        before = _client_ports(FRONT)
        for _ in range(1200):
            stub.ServerLive(pb.ServerLiveRequest(), timeout=10)
        assert _client_ports(FRONT) == before and len(before) == 1
