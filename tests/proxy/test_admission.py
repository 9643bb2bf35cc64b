"""Admission: requests, bytes and, per pipeline, requests and megapixels in flight."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np
import pytest
import yaml

from proxy import metrics
from proxy.engine.admission import Admission
from proxy.engine.room import PipelineLimits
from proxy.errors import Problem
from tests.proxy.scripted import ScriptedModel
from v2server.model import TensorSpec


async def test_a_pipelines_megapixels_bound_what_it_takes() -> None:
    admission = Admission(100, 1 << 30, 1 << 28, {"ocr": PipelineLimits(max_pixels=10_000_000)})
    async with admission.admit("ocr", 9_000_000):
        with pytest.raises(Problem) as info:
            async with admission.admit("ocr", 2_000_000):
                pass
        assert info.value.status == 503 and "9.0 of 10 megapixels" in info.value.message
        async with admission.admit("ocr", 1_000_000):  # still fits
            pass
        async with admission.admit("digits", 50_000_000):  # another pipeline: no limit
            pass
    async with admission.admit("ocr", 40_000_000):  # alone, larger than the budget: passes
        pass


async def test_requests_in_flight_per_pipeline_and_overall() -> None:
    admission = Admission(2, 1 << 30, 1 << 28, {"ocr": PipelineLimits(max_in_flight=1)})
    async with admission.admit("ocr", 0):
        with pytest.raises(Problem, match="pipeline 'ocr' at capacity"):
            async with admission.admit("ocr", 0):
                pass
        async with admission.admit("digits", 0):
            with pytest.raises(Problem, match="proxy at capacity \\(2 requests"):
                async with admission.admit("digits", 0):
                    pass
    async with admission.admit("ocr", 0):  # released
        pass


def test_bytes_in_flight_shed_new_requests_and_cap_one() -> None:
    admission = Admission(10, 100, 60)
    first, second = admission.ledger(), admission.ledger()
    first.hold(60)
    with pytest.raises(Problem) as info:
        first.hold(1)
    assert info.value.status == 413
    second.hold(50)
    with pytest.raises(Problem, match="MiB of requests in flight"):
        admission.check_room()
    first.close()
    admission.check_room()
    assert admission.bytes_in_flight == 50


async def test_jobs_run_one_at_a_time_while_clients_wait_and_widen_once_quiet() -> None:
    """The services' cores are shared: while requests whose clients wait are served (and for
    `quiet_s` after), jobs take turns; a process with no such clients runs them side by side."""
    admission = Admission(100, 1 << 30, 1 << 28, busy_background=1, quiet_s=0.2)
    # No client waiting: jobs side by side.
    await asyncio.wait_for(admission.wait_background("ocr", 0, 0.5), 1)
    await asyncio.wait_for(admission.wait_background("ocr", 0, 0.5), 1)
    admission.background_done("ocr", 0)
    admission.background_done("ocr", 0)

    loop = asyncio.get_running_loop()
    async with admission.admit("digits", 0):  # a client waiting
        await admission.wait_background("ocr", 0, 0.5)  # the first job still runs
        waiting = asyncio.ensure_future(admission.wait_background("ocr", 0, 0.5))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # a second one waits its turn
        admission.background_done("ocr", 0)
        await asyncio.wait_for(waiting, 1)  # its turn: the first ended
        third = asyncio.ensure_future(admission.wait_background("ocr", 0, 0.5))
        await asyncio.sleep(0.3)
        assert not third.done()
    quiet = loop.time()
    await asyncio.wait_for(third, 2)  # the client gone for quiet_s: side by side again
    assert loop.time() - quiet >= 0.15
    assert admission._background["ocr"][0] == 2


def test_an_upload_is_refused_once_it_would_pass_the_bytes_in_flight() -> None:
    """Requests that start together each find room when they start (check_room); their
    uploads, counted as they arrive, are refused once the proxy would pass its bound: 503
    (the rest of the body is dropped unread)."""
    admission = Admission(10, 100, 80)
    first, second = admission.ledger(), admission.ledger()
    admission.check_room()  # both started with room
    first.hold_upload(60)
    second.hold_upload(40)  # exactly the bound: taken
    with pytest.raises(Problem) as info:
        second.hold_upload(1)
    assert info.value.status == 503 and not info.value.close  # the rest is dropped unread
    assert "MiB of requests in flight" in info.value.message
    assert admission.bytes_in_flight == 100  # never more than the bound
    first.close()
    second.hold_upload(40)  # room again once a request ends
    with pytest.raises(Problem) as info:
        second.hold_upload(1)  # past its own bound (80): 413, as before
    assert info.value.status == 413
    second.close()
    alone = Admission(10, 100, 1000).ledger()
    alone.hold_upload(150)  # larger than the bound, but alone: passes (as a big image does)
    with pytest.raises(Problem, match="MiB of requests in flight"):
        Admission.ledger(alone.admission).hold_upload(1)  # while it holds them, none else


def _photo(width: int, height: int, progressive: bool = False, ext: str = ".jpg") -> bytes:
    img = np.full((height, width), 200, np.uint8)
    img[height // 3 : height // 2, width // 3 : width // 2] = 30
    params = [cv2.IMWRITE_JPEG_PROGRESSIVE, 1] if progressive else []
    return cv2.imencode(ext, img, params)[1].tobytes()


def _looking(decoding: tuple[str, int] | None) -> tuple[ScriptedModel, asyncio.Event]:
    """A model sent the upload as it came, held until the event is set."""
    gate = asyncio.Event()

    async def look(inputs, deadline):
        await gate.wait()
        return {"y": np.zeros((1, 1), np.float32)}

    model = ScriptedModel(
        "look",
        look,
        inputs=(TensorSpec("image", "BYTES", (-1,)),),
        outputs=(TensorSpec("y", "FP32", (-1, -1)),),
        decoding=decoding,
    )
    return model, gate


def _photos_pipeline() -> dict:
    return {
        "photos": {
            "input": "image",
            "accept": ["png", "jpeg"],
            "max_inflight_mpx": 1,
            "max_queued": 0,  # refused at once, not waiting for room: what is counted shows
            "steps": [
                {
                    "call": {
                        "name": "look",
                        "endpoint": "LOOK_URL",
                        "model": "look",
                        "inputs": {"image": "request.image"},
                    }
                }
            ],
            "result": {"y": "look.y"},
        }
    }


async def _held(model: ScriptedModel, calls: int) -> None:
    while model.calls < calls:  # noqa: ASYNC110 (the model counts its calls, no event)
        await asyncio.sleep(0.01)


async def test_a_jpeg_is_counted_as_its_model_decodes_it(make_client, servers) -> None:
    """A 3 Mpx photo sent to a model that decodes it keeping 0.1 Mpx (at 1/4: 0.19 Mpx)
    takes that much of the pipeline's 1 Mpx: a second one runs beside it. Counted as its
    header declares it, the second was refused 503 (a phone's 12 Mpx photos, two at once, to
    `digits`' 24 Mpx). A progressive JPEG and a PNG are decoded whole, and counted so."""
    model, gate = _looking(("image", 100_000))
    address = await servers(model)
    photo = _photo(2000, 1500)
    post = "/v1/pipelines/photos/infer"
    async with make_client(_photos_pipeline(), {"LOOK_URL": address}) as client:
        # The model's configuration is asked once the pipeline meets a JPEG: until it has
        # answered, a photo is counted whole (and the second refused here).
        for _ in range(50):
            gate.clear()
            first = asyncio.ensure_future(client.post(post, content=photo))
            await asyncio.wait_for(_held(model, model.calls + 1), 10)
            second = asyncio.ensure_future(client.post(post, content=_photo(2000, 1502)))
            # Either it reaches the model beside the first, or it is refused: however slow
            # the machine, never told apart by a timeout.
            beside = asyncio.ensure_future(_held(model, model.calls + 1))
            await asyncio.wait([second, beside], timeout=10, return_when="FIRST_COMPLETED")
            if beside.done():
                break
            beside.cancel()
            assert second.result().status_code == 503, second.result().text
            gate.set()
            assert (await first).status_code == 200
        assert not second.done(), "a second photo was never let in beside the first"
        for refused in (_photo(2000, 1500, progressive=True), _photo(2000, 1500, ext=".png")):
            answer = await client.post(post, content=refused)
            assert answer.status_code == 503 and "megapixels in flight" in answer.text
        gate.set()
        assert [(await t).status_code for t in (first, second)] == [200, 200]


async def test_a_model_that_does_not_say_how_it_decodes_has_photos_counted_whole(
    make_client, servers
) -> None:
    model, gate = _looking(None)
    address = await servers(model)
    post = "/v1/pipelines/photos/infer"
    async with make_client(_photos_pipeline(), {"LOOK_URL": address}) as client:
        gate.set()
        assert (await client.post(post, content=_photo(2000, 1500))).status_code == 200
        gate.clear()
        first = asyncio.ensure_future(client.post(post, content=_photo(2000, 1504)))
        await asyncio.wait_for(_held(model, 2), 10)
        answer = await client.post(post, content=_photo(2000, 1502))
        assert answer.status_code == 503 and "3.0 of 1 megapixels" in answer.text
        gate.set()
        assert (await first).status_code == 200


async def test_a_photo_past_the_pipelines_megapixels_waits_for_room(make_client, servers) -> None:
    """Past `max_inflight_mpx` a client's photo waits for room once the pipeline's pace is
    known, and is answered once the first is (four clients sending 7 Mpx scans to `ocr` had
    21 of 24 refused 503); one the pace says would not be answered within its budget is told
    so at once (503), and does not wait."""
    model, gate = _looking(None)
    address = await servers(model)
    pipelines = _photos_pipeline()
    del pipelines["photos"]["max_queued"]
    post = "/v1/pipelines/photos/infer"
    waiting = metrics.WAITING.labels("photos")
    async with make_client(pipelines, {"LOOK_URL": address}) as client:
        # Two photos of 0.48 Mpx share the pipeline for at least 0.1 s: a pace of at most
        # ~10 Mpx a second, the seconds a photo waiting for room would take.
        shared = [
            asyncio.ensure_future(client.post(post, content=_photo(1000, 480 + i, ext=".png")))
            for i in range(2)
        ]
        await asyncio.wait_for(_held(model, 2), 10)
        await asyncio.sleep(0.1)
        gate.set()
        assert [(await t).status_code for t in shared] == [200, 200]
        gate.clear()
        first = asyncio.ensure_future(client.post(post, content=_photo(2000, 1500, ext=".png")))
        await asyncio.wait_for(_held(model, 3), 10)
        second = asyncio.ensure_future(
            client.post(
                post,
                content=_photo(2000, 1502, ext=".png"),
                headers={"X-Request-Timeout-Ms": "30000"},
            )
        )
        while waiting._value.get() < 1:  # noqa: ASYNC110 (a gauge, no event)
            await asyncio.sleep(0.01)
        hurried = await client.post(
            post, content=_photo(1000, 1000, ext=".png"), headers={"X-Request-Timeout-Ms": "300"}
        )
        assert hurried.status_code == 503, hurried.text
        assert "'photos' would not answer within the request's budget" in hurried.text
        assert waiting._value.get() == 1 and model.calls == 3  # the second still waits
        gate.set()
        assert [(await t).status_code for t in (first, second)] == [200, 200]
        assert model.calls == 4 and waiting._value.get() == 0


@pytest.mark.parametrize(
    ("said", "counted_as"),
    [
        ("100000", 505 * 378),  # decoded at 1/4
        ("0", 2017 * 1511),  # decoded whole
        (None, 2017 * 1511),  # a model that does not say
        ("²", 2017 * 1511),  # anyone's server: str.isdigit() takes it, int() does not
        ("9" * 5000, 2017 * 1511),  # past int()'s 4,300 digits
        ("-5", 2017 * 1511),
        ("", 2017 * 1511),
    ],
)
def test_what_a_model_says_of_its_decode_is_read_never_trusted(
    tmp_path, said: str | None, counted_as: int
) -> None:
    from protos import pb
    from protos.decoded import MIN_PIXELS_PARAMETER
    from proxy.engine import plan
    from proxy.engine.pixels import counted
    from proxy.transport.catalog import Described

    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump({"pipelines": _photos_pipeline()}))
    photos = plan.load(path, {"LOOK_URL": "127.0.0.1:1"})["photos"]
    config = pb.ModelConfig(name="look")
    if said is not None:
        config.parameters[MIN_PIXELS_PARAMETER + "image"].string_value = said

    class Catalog:
        def last(self, address: str, model: str, version: str = "") -> Described:
            assert (address, model) == ("127.0.0.1:1", "look")
            return Described(pb.ModelMetadataResponse(name="look"), config, b"")

    photo = _photo(2017, 1511)
    assert counted(photos, Catalog(), photo, 2017, 1511) == counted_as  # type: ignore[arg-type]
    png = _photo(2017, 1511, ext=".png")
    assert counted(photos, Catalog(), png, 2017, 1511) == 2017 * 1511  # type: ignore[arg-type]
