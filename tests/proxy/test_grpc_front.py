"""The gRPC front's route (proxy/doors/grpc_front.py), as nginx calls it: a unary ModelInfer
over HTTP/1.1, answered by the door's own servicer with the call's deadline, its errors as
gRPC statuses in headers (nginx sends them as trailers). nginx itself: tests/e2e."""

from __future__ import annotations

import asyncio
import time
import zlib
from urllib.parse import unquote

import grpc
import httpx
import numpy as np
import pytest
from starlette.responses import PlainTextResponse

from protos import messages, pb
from protos.logs import REQUEST_ID
from proxy.doors.grpc_front import FRONT_HEADER, PATH, STATUS_ONLY, GrpcFront, grpc_timeout
from proxy.engine.admission import Admission
from tests.proxy.scripted import affine
from v2server.registry import Registry
from v2server.server import V2Server
from v2server.settings import ServerSettings


def _framed(message: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(message).to_bytes(4, "big") + message


def _request(model: str = "plus1", x: float = 1.0) -> bytes:
    return messages.build_request_bytes(model, {"x": np.full((1, 2), x, np.float32)})


async def _fallback(scope, receive, send) -> None:
    await PlainTextResponse("not the front's", status_code=404)(scope, receive, send)


def _client(
    delay_s: float = 0.0,
    api_key: str | None = None,
    admission: Admission | None = None,
    max_message_bytes: int = 1 << 20,
):
    model = affine("plus1", 1, 1, delay_s=delay_s)
    door = V2Server(
        Registry.of(model), ServerSettings(port=0), server_name="door", server_version="0"
    )
    admission = admission or Admission(100, 1 << 30, 1 << 28)
    front = GrpcFront(
        _fallback,
        door=door,
        admission=admission,
        api_key=api_key,
        max_message_bytes=max_message_bytes,
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://front")
    return client, model, door


async def _call(client: httpx.AsyncClient, body: bytes, **headers: str) -> httpx.Response:
    sent = {"content-type": "application/grpc", FRONT_HEADER.decode(): "1", **headers}
    return await client.post(PATH, content=body, headers=sent)


def _status(answer: httpx.Response) -> tuple[int, str]:
    """(grpc-status, grpc-message as sent: percent-encoded). An answer with its message is
    OK by nginx's trailer; an error is its status alone."""
    if answer.status_code == 200:
        assert "grpc-status" not in answer.headers and answer.content
        return 0, ""
    assert answer.status_code == STATUS_ONLY and answer.content == b""
    return int(answer.headers["grpc-status"]), answer.headers.get("grpc-message", "")


async def test_a_call_is_answered_with_its_message_and_status_ok() -> None:
    client, _, door = _client()
    async with client:
        answer = await _call(client, _framed(_request(x=2.0)), **{"x-request-id": "front-1"})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/grpc"
    assert "grpc-status" not in answer.headers  # nginx's trailer: grpc-status 0
    body = answer.content
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    response = pb.ModelInferResponse.FromString(body[5:])
    assert messages.response_outputs(response)["y"].tolist() == [[3.0, 3.0]]
    assert door.in_flight.count == 0


async def test_the_call_runs_under_its_request_id() -> None:
    """The call's `x-request-id` (gRPC metadata, a header here) is the id its work runs
    and logs under, as on the door itself; without one, none is made up here."""
    seen: list[str] = []
    model = affine("plus1", 1, 1)
    inner = model.fn

    async def noting(inputs, deadline):
        seen.append(REQUEST_ID.get())
        return await inner(inputs, deadline)

    model.fn = noting
    door = V2Server(
        Registry.of(model), ServerSettings(port=0), server_name="door", server_version="0"
    )
    front = GrpcFront(_fallback, door=door, admission=Admission(100, 1 << 30, 1 << 28))
    transport = httpx.ASGITransport(app=front)
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        answer = await _call(client, _framed(_request()), **{"x-request-id": "front-1"})
        assert _status(answer) == (0, "")
        answer = await _call(client, _framed(_request()))
        assert _status(answer) == (0, "")
    assert seen == ["front-1", ""]


async def test_the_call_keeps_its_grpc_timeout_and_is_cut_at_it() -> None:
    client, model, _ = _client(delay_s=5.0)
    async with client:
        start = time.monotonic()
        answer = await _call(client, _framed(_request()), **{"grpc-timeout": "300m"})
        took = time.monotonic() - start
    assert _status(answer)[0] == 4, answer.headers  # DEADLINE_EXCEEDED
    assert 0.1 < model.remaining_s[0] <= 0.3, model.remaining_s
    assert took < 5, "the model ran on past the call's deadline"
    await asyncio.sleep(0)
    assert model.cancelled == 1


async def test_a_message_that_trickles_in_is_cut_at_the_calls_deadline() -> None:
    client, model, door = _client()
    message = _framed(_request())

    async def slowly():
        yield message[:5]
        await asyncio.sleep(3)
        yield message[5:]

    async with client:
        start = time.monotonic()
        answer = await _call(client, slowly(), **{"grpc-timeout": "300m"})  # type: ignore[arg-type]
        took = time.monotonic() - start
    assert _status(answer) == (4, "the message came too slowly"), answer.headers
    assert took < 2 and model.calls == 0 and door.in_flight.count == 0


def _deflated(message: bytes, encoding: str) -> bytes:
    """`message` compressed as a gRPC client does for `grpc-encoding: <encoding>`."""
    wbits = {"gzip": 31, "deflate": 15}[encoding]
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return packer.compress(message) + packer.flush()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [2, 40_000], ids=["small", "inflated-off-the-loop"])
async def test_a_compressed_call_is_answered_as_one_that_is_not(encoding: str, size: int) -> None:
    """tritonclient's `compression_algorithm` and perf_analyzer's --grpc-compression-algorithm
    send them; grpc.aio's door inflates them itself."""
    message = _request(x=2.0)
    if size > 2:  # random floats: over 64 KiB even compressed, so inflated off the loop
        message = messages.build_request_bytes(
            "plus1", {"x": np.random.default_rng(1).random((1, size), np.float32)}
        )
    client, model, _ = _client()
    async with client:
        plain = await _call(client, _framed(message))
        packed = await _call(
            client, _framed(_deflated(message, encoding), 1), **{"grpc-encoding": encoding}
        )
    assert _status(packed) == (0, "") and packed.content == plain.content
    assert model.calls == 2


@pytest.mark.parametrize(
    ("message", "encoding", "code", "says"),
    [
        (
            _deflated(b"\x00" * (4 << 20), "gzip"),
            "gzip",
            8,
            "bytes once inflated (PROXY_MAX_BODY_MB)",
        ),
        (_deflated(_request(), "gzip")[:-6], "gzip", 3, "the gzip data is cut short"),
        (b"not deflated at all", "deflate", 3, "the deflate data does not inflate"),
        (_deflated(_request(), "gzip"), "snappy", 12, "encoding 'snappy' is not supported"),
    ],
    ids=["bomb", "cut-short", "garbage", "unknown-encoding"],
)
async def test_a_compressed_call_that_does_not_inflate_is_refused_by_name(
    message: bytes, encoding: str, code: int, says: str
) -> None:
    client, model, _ = _client(max_message_bytes=1 << 20)
    async with client:
        answer = await _call(client, _framed(message, 1), **{"grpc-encoding": encoding})
    status, text = _status(answer)
    assert status == code and says in unquote(text), text
    assert model.calls == 0


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        (_framed(_request("nosuch")), 5, "unknown model 'nosuch'"),
        (_framed(_request(), flag=1), 3, "a compressed message without its grpc-encoding"),
        (_framed(_request())[:-3], 3, "exactly one message"),
        (_framed(_request()) * 2, 3, "exactly one message"),
        (b"\x00\x00", 3, "no gRPC message"),
        (_framed(b"\xff\xff\xff"), 3, "request does not parse"),
    ],
    ids=["unknown-model", "compressed", "cut-short", "two-messages", "no-message", "garbage"],
)
async def test_bad_calls_get_the_doors_status_and_message(
    body: bytes, code: int, says: str
) -> None:
    client, model, door = _client()
    async with client:
        answer = await _call(client, body)
    status, message = _status(answer)
    # nginx answers it as a status alone (Trailers-Only: grpc_front_nginx.py).
    assert answer.status_code == STATUS_ONLY and answer.content == b""
    assert status == code and says in unquote(message), message
    assert model.calls == 0 and door.in_flight.count == 0


async def test_the_api_key_is_asked_for_as_on_the_door() -> None:
    client, model, _ = _client(api_key="sesame")
    async with client:
        refused = await _call(client, _framed(_request()))
        wrong = await _call(client, _framed(_request()), **{"x-api-key": "open"})
        bearer = await _call(client, _framed(_request()), authorization="Bearer sesame")
    assert _status(refused) == (16, "missing or wrong API key")
    assert _status(wrong)[0] == 16 and _status(bearer)[0] == 0
    assert model.calls == 1


async def test_a_plain_post_without_the_fronts_header_is_not_a_grpc_call() -> None:
    client, model, _ = _client()
    async with client:
        answer = await client.post(PATH, content=_framed(_request()))
    assert answer.status_code == 404 and "grpc-status" not in answer.headers
    assert model.calls == 0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("300m", 0.3), ("2S", 2.0), ("1M", 60.0), ("1H", 3600.0), ("5000u", 0.005),
     ("7n", 7e-9), ("", None), ("10", None), ("m", None), ("1.5S", None), ("-1S", None)],
)  # fmt: skip
def test_grpc_timeout_headers_are_read_as_the_spec_writes_them(
    value: str, seconds: float | None
) -> None:
    assert grpc_timeout(value) == (pytest.approx(seconds) if seconds is not None else None)


async def test_a_message_counts_in_the_bytes_in_flight_and_is_refused_past_them() -> None:
    """The message is on the proxy's bytes in flight while it arrives and is answered (as
    REST's uploads): past the bound, UNAVAILABLE as REST's 503, and its bytes let go."""
    message = _framed(_request())
    roomy = Admission(100, 1 << 20, 1 << 20)
    client, _, _ = _client(admission=roomy)
    async with client:
        assert _status(await _call(client, message))[0] == grpc.StatusCode.OK.value[0]
    assert roomy.bytes_in_flight == 0  # released once answered
    tight = Admission(100, len(message) + 10, 1 << 20)
    other = tight.ledger()
    other.hold(20)  # another request's bytes: this message no longer fits beside them
    client, model, _ = _client(admission=tight)
    async with client:
        answer = await _call(client, message)
    code, text = _status(answer)
    assert code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert "requests in flight" in unquote(text)
    # As REST's 503 and its Retry-After: 1, for a client's gRPC retry policy (gRFC A6).
    assert answer.headers["http-status"] == "503"
    assert answer.headers["grpc-retry-pushback-ms"] == "1000"
    assert tight.bytes_in_flight == 20 and model.calls == 0  # its own bytes let go
