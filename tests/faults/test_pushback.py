"""A refusal tells gRPC callers when to come back, as REST's `Retry-After` does: the
`grpc-retry-pushback-ms` trailer, which a client's gRPC retry policy waits instead of its own
backoff (gRFC A6). On both of the door's paths: nginx's front and grpc.aio's server. The
pipeline takes one request at a time, none waiting for room, and a relay holds each for
0.7 s, so a second caller is refused while the first runs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import pytest

from protos import pb_grpc
from protos.channels import SERVICE_NAME
from proxy.doors import grpc_front_nginx as nginx
from proxy.settings import ProxySettings
from tests.conftest import Mesh
from tests.e2e.test_grpc_front import _image_request
from tests.faults.test_faults import BODY
from tests.faults.test_slow_step import _chain_env, _relay, _relay_counts
from tests.procs import metric_of

pytestmark = pytest.mark.alone  # the relay's hold is timed against the proxy's pushback

REST, FRONT, DOOR = 27290, 27291, 27292
HOLD_MS = 700
"""Each request's hold in the relay: less than the 1 s a capacity refusal asks to wait, far
more than the retry policy's own 10 ms backoff."""
RETRY_ONCE = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": SERVICE_NAME}],
                "retryPolicy": {
                    "maxAttempts": 2,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.01s",
                    "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def _refused(url: str) -> float:
    return metric_of(url, "v2_requests_total", method="ModelInfer", code="UNAVAILABLE")


@pytest.mark.parametrize("path", ["front", "door"])
def test_a_refusal_tells_a_retry_policy_when_to_come_back(
    mesh: Mesh, tmp_path: Path, path: str
) -> None:
    if nginx.binary(ProxySettings()) is None:
        pytest.fail("nginx is missing (./mesh test installs it)")
    relay = _relay(mesh, "digits-logreg", tmp_path, delay_ms=HOLD_MS)
    env = {
        **_chain_env(mesh, tmp_path, relay, max_in_flight=1, max_queued=0),
        "PROXY_GRPC_PORT": str(FRONT),
        "PROXY_GRPC_DOOR_PORT": str(DOOR),
        "PROXY_GRPC_FRONT": "nginx",
    }
    address = f"127.0.0.1:{FRONT if path == 'front' else DOOR}"
    request = _image_request("chain", BODY)
    try:
        with (
            mesh.extra_proxy(REST, **env) as url,
            grpc.insecure_channel(address) as plain,
            grpc.insecure_channel(address, [("grpc.service_config", RETRY_ONCE)]) as polite,
        ):
            pb_grpc.GRPCInferenceServiceStub(plain).ModelInfer(request, timeout=10)  # warm
            refused_before = _refused(url)
            first = pb_grpc.GRPCInferenceServiceStub(plain).ModelInfer.future(request, timeout=10)
            while metric_of(url, "proxy_in_flight_requests") < 1 and not first.done():
                time.sleep(0.01)
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.GRPCInferenceServiceStub(plain).ModelInfer(request, timeout=10)
            answer: list = []
            # Refused too while the first runs; retried once the pushback has passed, when
            # the first has ended. The policy's own 10 ms backoff would be refused again.
            waited = threading.Thread(
                target=lambda: answer.append(
                    pb_grpc.GRPCInferenceServiceStub(polite).ModelInfer(request, timeout=10)
                )
            )
            waited.start()
            first.result()
            waited.join()
            refusals = _refused(url) - refused_before
    finally:
        _relay_counts(relay)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "at capacity" in refused.value.details()
    trailers = dict(refused.value.trailing_metadata())
    assert trailers["http-status"] == "503"
    assert trailers["grpc-retry-pushback-ms"] == "1000"
    assert len(answer) == 1 and answer[0].model_name == "chain"
    assert refusals == 2, "the polite caller's first attempt was not refused: no retry seen"
