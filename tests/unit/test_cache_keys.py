"""Cache keys: every part of a request's tensors decides its key, and a big input is hashed
off the event loop with the same key it would have had on it."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest

from predictors.repository import DIGEST_PARAMETER
from protos import grpc_predict_v2_pb2 as pb
from protos.version import code_digest
from proxy.engine.cache import keys
from proxy.engine.cache.fingerprints import Fingerprints
from proxy.transport.catalog import Catalog
from proxy.transport.target import Target

TARGET = Target("PREPROCESS_URL", "127.0.0.1:1", "digits_input")


class Services:
    """What the catalog asks: a model's metadata, here of a fixed version, and its
    configuration, with the digest of its files a predictor reports."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.digest = "a" * 64

    async def metadata(
        self, address: str, model: str, version: str, timeout_s: float
    ) -> pb.ModelMetadataResponse:
        return pb.ModelMetadataResponse(name=model, versions=[self.version], platform="onnx")

    async def config(
        self, address: str, model: str, version: str, timeout_s: float
    ) -> pb.ModelConfigResponse:
        answer = pb.ModelConfigResponse(config=pb.ModelConfig(name=model, max_batch_size=64))
        answer.config.parameters[DIGEST_PARAMETER].string_value = self.digest
        return answer


def one(*elements: object) -> np.ndarray:
    out = np.empty(len(elements), dtype=object)
    out[:] = elements
    return out


def fingerprints(version: str = "1") -> Fingerprints:
    return Fingerprints(Catalog(Services(version), check_s=60.0, timeout_s=1.0))  # type: ignore[arg-type]


async def key(inputs: dict[str, np.ndarray], prints: Fingerprints | None = None) -> bytes | None:
    return await keys.step_key(TARGET, ["pixels"], prints or fingerprints(), inputs)


async def test_every_part_of_the_inputs_decides_the_key() -> None:
    image = one(b"\x89PNG" + bytes(range(200)))
    same = await key({"image": one(b"\x89PNG" + bytes(range(200)))})
    variants = [
        {"image": image},
        {"picture": image},  # another name
        {"image": one(b"\x89PNG" + bytes(range(199)))},  # other bytes
        {"image": image.reshape(1, 1)},  # another shape
        {"image": one(b"ab", b"c")},  # the same bytes cut into other elements
        {"image": one(b"a", b"bc")},
        {"image": np.frombuffer(b"abcd", dtype=np.uint8)},  # another datatype, same bytes
        {"image": np.frombuffer(b"abcd", dtype=np.int8)},
        {"image": image, "extra": np.zeros(2, np.float32)},
    ]
    found = [await key(v) for v in variants]
    assert found[0] == same
    assert len(set(found)) == len(found)
    assert await key({"image": image}, fingerprints("2")) != same  # a new model version


async def test_the_engines_code_decides_the_key(monkeypatch) -> None:
    """Another engine (an upgrade that assembles answers differently) never reads the
    entries the old one made in a shared cache, though the package's version is the same."""
    names = {path.name for path in keys.ENGINE_SOURCES}
    assert {"combine.py", "results.py", "executor.py", "keys.py"} <= names
    assert keys.SCHEME.endswith(code_digest(keys.ENGINE_SOURCES).encode())
    image = {"image": one(b"\x89PNG" + bytes(range(200)))}
    before = await key(image)
    monkeypatch.setattr(keys, "SCHEME", keys.SCHEME[:-1] + b"!")  # one byte of the code's digest
    assert await key(image) != before


async def test_a_big_input_is_hashed_off_the_loop_with_the_same_key(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    inputs = {"image": one(rng.bytes(3 << 20)), "scale": rng.random((512, 512))}
    prints = fingerprints()
    await prints.of(TARGET)  # known: a key asks nothing more of the services
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    beside = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = ticks
    off_loop = await key(inputs, prints)
    ran_meanwhile = ticks - started
    monkeypatch.setattr(keys, "HASH_IN_THREAD", 1 << 40)  # everything on the loop
    started = ticks
    on_loop = await key(inputs, prints)
    assert ticks == started  # on the loop: nothing else ran while it hashed
    beside.cancel()
    assert off_loop == on_loop
    assert ran_meanwhile > 0  # the loop went on serving while the big input was hashed


async def test_parts_digest_as_their_join_and_off_the_loop_when_big(monkeypatch) -> None:
    """The helper the keys and the jobs' door (an Idempotency-Key's body) digest with: the
    same SHA-256 as over the joined bytes, and a big upload's on a worker thread."""
    monkeypatch.setattr(keys, "HASH_IN_THREAD", 1 << 20)
    for size in (1 << 10, 3 << 20):
        parts = [b"ocr\0image\0", np.random.default_rng(size).bytes(size)]
        ticked = asyncio.Event()
        beside = asyncio.get_running_loop().call_soon(ticked.set)
        found = await keys.digest_of(parts, size)
        beside.cancel()
        assert found == hashlib.sha256(b"".join(parts)).digest()
        assert ticked.is_set() == (size > keys.HASH_IN_THREAD)  # the loop ran meanwhile


@pytest.mark.parametrize("datatype", [np.float32, np.int64, np.uint8, np.bool_])
async def test_a_view_hashes_as_its_contents(datatype) -> None:
    """A strided or non-native-order view keys as the contiguous array of the same values."""
    base = np.arange(48).reshape(6, 8).astype(datatype)
    view = base[::2, 1::3]
    assert await key({"x": view}) == await key({"x": np.ascontiguousarray(view)})
    swapped = np.ascontiguousarray(view).astype(view.dtype.newbyteorder())
    assert await key({"x": swapped}) == await key({"x": np.ascontiguousarray(view)})


async def test_a_read_only_input_is_digested_once_and_keys_as_a_fresh_copy(monkeypatch) -> None:
    """The pipeline's key and a step's may read the same tensor: digested once while it
    lives, and only when nothing can write to it (a digest cannot go stale)."""
    digested: list[int] = []
    contents = keys._contents
    monkeypatch.setattr(keys, "_contents", lambda a: digested.append(id(a)) or contents(a))
    tensor = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor.setflags(write=False)
    prints = fingerprints()
    first = await key({"x": tensor}, prints)
    assert await key({"x": tensor}, prints) == first
    assert digested == [id(tensor)]
    writable = tensor.copy()
    assert await key({"x": writable}, prints) == first  # the same contents, the same key
    assert await key({"x": writable}, prints) == first
    assert digested == [id(tensor), id(writable), id(writable)]  # digested every time


async def test_an_upload_keys_alike_hashed_at_once_or_the_general_way(monkeypatch) -> None:
    """An upload (one bytes element) is hashed at once, without awaiting, once its models'
    fingerprints are known: the same key as the general way gives (the first request's),
    and another image another key."""
    digested: list[int] = []
    contents = keys._contents
    monkeypatch.setattr(keys, "_contents", lambda a: digested.append(id(a)) or contents(a))
    image = one(b"\x89PNG" + bytes(range(100)))
    image.setflags(False)
    prints = fingerprints()
    first = await key({"image": image}, prints)  # the base made: the general way
    assert digested == [id(image)]
    again = one(b"\x89PNG" + bytes(range(100)))
    assert await key({"image": again}, prints) == first
    assert await key({"image": image}, prints) == first
    assert digested == [id(image)]  # the quick way: not framed by _contents
    other = one(b"\x89PNG" + bytes(range(1, 101)))
    assert await key({"image": other}, prints) not in (first, None)
    # Past the size hashed at once, and for any other tensor, the general way.
    big = one(b"\x89PNG" + bytes(keys.HASH_IN_THREAD))
    await key({"image": big}, prints)
    assert digested[-1] == id(big)


async def test_a_step_key_made_without_waiting_is_the_one_awaited() -> None:
    """The executor asks `step_key_now` first: none before the base is made, then the same key
    as `step_key` for the same inputs (a known tensor's too), and another for other inputs."""
    prints = fingerprints()
    image = one(b"\x89PNG" + bytes(range(100)))
    known = np.arange(8, dtype=np.float32)
    known.setflags(False)
    assert keys.step_key_now(TARGET, ("pixels",), prints, {"image": image}) is None
    for inputs in ({"image": image}, {"image": image, "features": known}):
        awaited = await key(inputs, prints)  # a known tensor's digest is remembered
        assert keys.step_key_now(TARGET, ("pixels",), prints, inputs) == awaited
    other = {"image": one(b"\x89PNG" + bytes(range(1, 101)))}
    assert keys.step_key_now(TARGET, ("pixels",), prints, other) not in (awaited, None)
    # Another step's outputs: another base, made only by awaiting.
    assert keys.step_key_now(TARGET, ("other",), prints, {"image": image}) is None


async def test_a_new_model_version_changes_the_key_once_its_fingerprint_is_asked_again() -> None:
    """The key's base is kept while the models' fingerprints are fresh, then made again."""
    services = Services("1")
    prints = Fingerprints(Catalog(services, check_s=0.05, timeout_s=1.0))  # type: ignore[arg-type]
    inputs = {"image": one(b"\x89PNG" + bytes(range(50)))}
    before = await key(inputs, prints)
    services.version = "2"
    assert await key(inputs, prints) == before  # still fresh: the version is not asked
    await asyncio.sleep(0.1)
    after = await key(inputs, prints)
    assert after is not None and after != before
    assert after == await key(inputs, fingerprints("2"))


async def test_a_model_replaced_in_place_changes_the_key_once_asked_again() -> None:
    """The same version number, other files (weights, labels): the digest a predictor
    reports in its configuration changes, and with it the key."""
    services = Services("1")
    prints = Fingerprints(Catalog(services, check_s=0.05, timeout_s=1.0))  # type: ignore[arg-type]
    inputs = {"image": one(b"\x89PNG" + bytes(range(50)))}
    before = await key(inputs, prints)
    services.digest = "b" * 64
    await asyncio.sleep(0.1)
    after = await key(inputs, prints)
    assert before is not None and after is not None and after != before
