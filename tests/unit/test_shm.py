"""The shared memory registry: names, keys and bounds are checked before any byte moves."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from protos import messages, pb, wire
from protos.errors import AlreadyExists, InvalidInput, NotFound, Unsupported
from protos.messages import SharedRef
from v2server.shm import SHM_DIR, SharedMemory


def inputs_of(request: pb.ModelInferRequest, **kwargs) -> dict[str, np.ndarray]:
    """What a server decodes from `request`, received as bytes."""
    return messages.request_inputs(wire.parse_infer_request(request.SerializeToString()), **kwargs)


def built_response(model: str, version: str, outputs: dict) -> pb.ModelInferResponse:
    return pb.ModelInferResponse.FromString(messages.build_response_bytes(model, version, outputs))


@pytest.fixture
def key() -> Iterator[str]:
    name = f"mesh-unit-{uuid.uuid4().hex[:8]}"
    path = SHM_DIR / name
    path.write_bytes(bytes(range(64)))
    yield f"/{name}"
    path.unlink(missing_ok=True)


def test_register_read_write_status_unregister(key: str) -> None:
    shm = SharedMemory()
    shm.register("r", key, 8, 32)
    assert bytes(shm.read(SharedRef("r", 4, 2), "t")) == bytes([10, 11, 12, 13])
    shm.write(SharedRef("r", 8, 0), "out", b"\xff" * 3)
    assert (SHM_DIR / key[1:]).read_bytes()[8:12] == b"\xff\xff\xff\x0b"
    assert [(r.name, r.offset, r.byte_size) for r in shm.status("")] == [("r", 8, 32)]
    with pytest.raises(AlreadyExists):
        shm.register("r", key, 0, 8)
    shm.unregister("r")
    shm.unregister("r")  # unknown: no error, as in Triton
    with pytest.raises(NotFound):
        shm.status("r")


@pytest.mark.parametrize(
    ("name", "bad_key", "offset", "size", "text"),
    [
        ("a", "/../etc/passwd", 0, 8, "not a shared memory object name"),
        ("a", "/..", 0, 8, "not a shared memory object name"),
        ("a", "/no-such-region-here", 0, 8, "No such file"),
        ("", None, 0, 8, "needs a name"),
        ("a", None, 60, 8, "do not fit"),
        ("a", None, 0, 0, "do not fit"),
    ],
)
def test_bad_registrations_are_named(key, name, bad_key, offset, size, text) -> None:
    with pytest.raises(InvalidInput, match=text):
        SharedMemory().register(name, bad_key or key, offset, size)


def test_references_outside_a_region_or_to_unknown_regions(key: str) -> None:
    shm = SharedMemory()
    shm.register("r", key, 0, 16)
    with pytest.raises(InvalidInput, match="overrun shared memory region 'r'"):
        shm.read(SharedRef("r", 8, 12), "x")
    with pytest.raises(InvalidInput, match="needs 20 bytes"):
        shm.write(SharedRef("r", 16, 0), "y", b"\0" * 20)
    with pytest.raises(InvalidInput, match="'q' is not registered"):
        shm.read(SharedRef("q", 4, 0), "x")


def test_unregister_while_a_request_still_reads(key: str) -> None:
    shm = SharedMemory()
    shm.register("r", key, 0, 16)
    held = np.frombuffer(shm.read(SharedRef("r", 16, 0), "x"), np.uint8)
    shm.unregister("")  # the map stays open for the array that still uses it
    assert held[:3].tolist() == [0, 1, 2]


def test_codec_reads_shared_inputs_beside_raw_ones(key: str) -> None:
    shm = SharedMemory()
    (SHM_DIR / key[1:]).write_bytes(np.arange(4, dtype=np.float32).tobytes())
    shm.register("r", key, 0, 16)
    request = messages.build_request("m", {"b": np.array([7], np.int32)})
    shared = request.inputs.add(name="a", datatype="FP32", shape=[2, 2])
    shared.parameters[messages.SHM_REGION].string_param = "r"
    shared.parameters[messages.SHM_BYTE_SIZE].int64_param = 16
    got = inputs_of(request, shared=shm.read)
    assert got["a"].tolist() == [[0, 1], [2, 3]] and got["b"].tolist() == [7]
    with pytest.raises(InvalidInput, match="has no shared memory"):
        inputs_of(request)
    shared.parameters[messages.SHM_BYTE_SIZE].int64_param = 12
    with pytest.raises(InvalidInput, match="'a'"):
        inputs_of(request, shared=shm.read)


def test_shared_outputs_keep_one_raw_entry_per_output() -> None:
    """Triton's C++ client reads raw_output_contents[i] for every output i unchecked: a
    shared memory output needs its (empty) entry, or perf_analyzer crashes."""
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    shared = {"y": (y, SharedRef("out", 24, 0))}
    body = messages.build_response_bytes("m", "1", {"label": np.array([2, 0])}, "id", shared)
    response = pb.ModelInferResponse.FromString(body)
    assert [o.name for o in response.outputs] == ["label", "y"]
    assert [len(r) for r in response.raw_output_contents] == [16, 0]
    assert response.outputs[1].parameters[messages.SHM_REGION].string_param == "out"
    assert set(messages.response_outputs(response)) == {"label"}
    # A server that lists the shared output first, or omits its entry when it is last.
    response.outputs[0].CopyFrom(response.outputs[1])
    response.outputs[1].name, response.outputs[1].datatype = "label", "INT64"
    response.outputs[1].ClearField("parameters")
    response.outputs[1].shape[:] = [2]
    response.raw_output_contents[:] = [b"", np.array([2, 0]).tobytes()]
    assert messages.response_outputs(response)["label"].tolist() == [2, 0]
    omitted = built_response("m", "1", {"label": np.array([2, 0])})
    omitted.outputs.add(name="y", datatype="FP32", shape=[2, 3]).parameters[
        messages.SHM_REGION
    ].string_param = "out"
    assert messages.response_outputs(omitted)["label"].tolist() == [2, 0]


def test_turned_off_refuses_registration(key: str) -> None:
    with pytest.raises(Unsupported, match="turned off"):
        SharedMemory(enabled=False).register("r", key, 0, 8)
