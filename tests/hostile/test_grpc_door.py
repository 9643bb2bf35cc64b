"""The proxy's gRPC door against rude clients, bounded as REST is: a shape the pipeline
refuses costs nothing to refuse, an image over REST's body limit is refused as it arrives,
idle connections cannot use up the proxy's descriptors. Real processes, raw gRPC."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import httpx
import pytest

from protos import pb, pb_grpc
from protos.channels import channel_options
from proxy.doors.grpc_front_nginx import front_pids
from tests.conftest import Mesh
from tests.hostile.probe import Watch, health_watched
from tests.hostile.test_front_door import digit, digits_ok
from tests.procs import ROOT
from tests.report import report

MB = 1 << 20


def _door_call(mesh: Mesh, request: pb.ModelInferRequest) -> grpc.RpcError | pb.ModelInferResponse:
    options = channel_options(256)
    with grpc.insecure_channel(mesh.grpc_address, options=options) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            return stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:
            return exc


def _door_pids(mesh: Mesh) -> list[int]:
    """The proxy and, where it has one, its gRPC front (nginx): the door's cost is theirs."""
    proxy = mesh.local.procs["proxy"].pid
    return [proxy, *front_pids(proxy)]


def _bytes_bomb(typed: bool) -> pb.ModelInferRequest:
    """5 M empty BYTES elements declared for the pipeline's `image` input, BYTES [1]."""
    count = 5_000_000
    request = pb.ModelInferRequest(model_name="digits")
    tensor = request.inputs.add(name="image", datatype="BYTES", shape=[count])
    if typed:
        tensor.contents.bytes_contents.extend([b""] * count)  # ~10 MB on the wire
    else:
        request.raw_input_contents.append(b"\x00\x00\x00\x00" * count)  # 20 MB
    return request


def test_a_bytes_bomb_at_the_door_is_refused_by_its_shape(mesh: Mesh) -> None:
    """It once took the proxy's event loop 8.6 s (and REST with it) to decode 16 M empty
    elements one by one before the shape said no."""
    for typed in (False, True):
        bomb = _bytes_bomb(typed)
        with health_watched(mesh.url) as slowest, Watch(*_door_pids(mesh)) as watch:
            answer = _door_call(mesh, bomb)
        kind = "typed contents" if typed else "raw contents"
        report(
            f"\nhostile: gRPC door, 5 M empty BYTES elements ({kind}, "
            f"{bomb.ByteSize() / MB:.0f} MiB): {answer.code().name} in "  # type: ignore[union-attr]
            f"{watch.cost.seconds:.2f} s, proxy (+front) CPU {watch.cost.cpu_s:.2f} s, peak "
            f"+{watch.cost.peak_growth_mb:.0f} MiB; /healthz at most {max(slowest):.3f} s"
        )
        assert isinstance(answer, grpc.RpcError)
        assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "expected shape [1], got [5000000]" in answer.details()
        assert watch.cost.seconds < 2 and watch.cost.peak_growth_mb < 200
        assert max(slowest) < 1
    assert digits_ok(mesh.url) == [200] * 4


def test_an_image_over_the_body_limit_is_refused_at_the_door(mesh: Mesh) -> None:
    """REST refuses a body over PROXY_MAX_BODY_MB (20 MiB) with 413; the door once forwarded
    a 40 MiB image (eight at once took the proxy from 1.1 to 2.2 GB, and it kept it)."""
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="image", datatype="BYTES", shape=[1])
    blob = digit() + b"\x00" * (40 * MB)
    request.raw_input_contents.append(len(blob).to_bytes(4, "little") + blob)
    with Watch(*_door_pids(mesh)) as watch:
        answer = _door_call(mesh, request)
    report(
        f"\nhostile: gRPC door, a 40 MiB image: {answer.code().name} in "  # type: ignore[union-attr]
        f"{watch.cost.seconds:.2f} s, proxy peak +{watch.cost.peak_growth_mb:.0f} MiB"
    )
    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert watch.cost.peak_growth_mb < 64
    ok = pb.ModelInferRequest(model_name="digits")
    ok.inputs.add(name="image", datatype="BYTES", shape=[1])
    ok.raw_input_contents.append(len(digit()).to_bytes(4, "little") + digit())
    answer = _door_call(mesh, ok)
    assert isinstance(answer, pb.ModelInferResponse), answer


def _held(holders: list[subprocess.Popen], ask: bool = True) -> list[tuple[int, ...]]:
    """Each holder's (opened, still open) as it counts them now: it prints a line once it
    has opened them all, then one for each line it is sent."""
    if ask:
        for holder in holders:
            holder.stdin.write("\n")  # type: ignore[union-attr]
            holder.stdin.flush()  # type: ignore[union-attr]
    return [tuple(map(int, h.stdout.readline().split())) for h in holders]  # type: ignore[union-attr]


def test_idle_connections_to_the_door_leave_rest_answering(mesh: Mesh) -> None:
    """21,000 idle HTTP/2 connections once used up the proxy's 20,000 descriptors: every
    REST request for the next 80 s was reset. The door holds at most
    PROXY_GRPC_MAX_CONNECTIONS (2048) and closes the rest as they come."""
    port = mesh.grpc_address.rsplit(":", 1)[1]
    script = str(ROOT / "tests" / "hostile" / "idle_connections.py")
    holders = [
        subprocess.Popen(
            [sys.executable, script, port, "7000"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        counts = _held(holders, ask=False)
        statuses = digits_ok(mesh.url, 8)
        with httpx.Client(base_url=mesh.url, timeout=10) as client:
            health = client.get("/healthz").status_code
        # Connections still in the listen backlog, or whose close the holder has not read
        # yet, look held for a while on a loaded machine (2,169 once after 1 s, against
        # ~1,775 usually): what is bounded is what is held once the door has caught up.
        held = [sum(c[1] for c in counts)]
        for _ in range(20):
            if held[-1] <= 2048 + 64:
                break
            time.sleep(0.5)
            held.append(sum(c[1] for c in _held(holders)))
    finally:
        for holder in holders:
            holder.stdin.close()  # type: ignore[union-attr]
            holder.wait(60)
            holder.stdout.close()  # type: ignore[union-attr]
    opened = sum(c[0] for c in counts)
    report(
        f"\nhostile: {opened} idle HTTP/2 connections to the gRPC door: held after 1 s and "
        f"then each 0.5 s {held}; REST meanwhile {statuses}"
    )
    assert opened >= 20_000
    assert held[-1] <= 2048 + 64
    assert statuses == [200] * 8 and health == 200
    ok = pb.ModelInferRequest(model_name="digits")
    ok.inputs.add(name="image", datatype="BYTES", shape=[1])
    ok.raw_input_contents.append(len(digit()).to_bytes(4, "little") + digit())
    assert isinstance(_door_call(mesh, ok), pb.ModelInferResponse)


@pytest.mark.parametrize("who", ["door", "digits-mlp"])
def test_a_flood_of_reset_streams_costs_the_server_no_more_than_the_attacker(
    mesh: Mesh, who: str
) -> None:
    """HTTP/2 rapid reset: 150,000 streams opened and reset at once on one connection (the
    attacker acknowledging the server's SETTINGS, as real tools do) cost a service ~9 s of CPU
    against the attacker's 0.4 s (and no GOAWAY came). gRPC core has no setting for a GOAWAY
    (tried: ping_on_rst_stream_percent 100, max_requests_per_read 32, concurrent-stream limits
    of 100 and 1024); with a concurrent-stream limit set (--max-concurrent-streams, 1024) the
    flood costs the server 0.7-1.4 s against the attacker's 0.5-1.2 s, and it keeps answering.
    The bound is 5x the attacker's (23x without the limit): a CI run on a loaded machine
    measured 1.6 s against 0.48 s (3.3x), the server's own background work included."""
    if who == "door":
        port, pids = mesh.grpc_address.rsplit(":", 1)[1], _door_pids(mesh)
    else:
        port = mesh.local.services[who].env["PREDICTOR_PORT"]
        pids = [mesh.local.procs[who].pid]
    script = str(ROOT / "tests" / "hostile" / "rapid_reset.py")
    with Watch(*pids) as watch:
        done = subprocess.run(
            [sys.executable, script, port, "150000"], capture_output=True, text=True, timeout=120
        )
    attack = json.loads(done.stdout)
    report(
        f"\nhostile: HTTP/2 rapid reset on the {who}: {attack['sent']} streams reset in "
        f"{attack['seconds']:.1f} s (GOAWAY: {attack['goaway']}); server CPU "
        f"{watch.cost.cpu_s:.2f} s against the attacker's {attack['cpu_s']:.2f} s"
    )
    assert attack["sent"] >= 150_000 or attack["goaway"] or attack["closed"]
    assert watch.cost.cpu_s < max(1.5, 5 * attack["cpu_s"])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    assert digits_ok(mesh.url) == [200] * 4
