"""The inference cache and the data cache, in process: hits and misses counted at the
services, the TTL, single flight, what is never cached, a model's new version, every door.
(Redis: tests/proxy/test_cache_redis.py; the store's bound: tests/unit/test_cache_store.py.)"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from protos.errors import InvalidInput
from proxy import metrics
from proxy.doors import rest
from proxy.engine.canaries import Canary
from proxy.engine.executor import Executor
from proxy.transport.target import Target
from tests.proxy.conftest import GENEROUS_CACHE_MS
from tests.proxy.scripted import ScriptedModel, affine, serve
from tests.proxy.test_pipelines import body, call, parse_model, partial_fan_out, pipeline, post

RESULT = {"y": "a.y[0]"}


@pytest.fixture
def make_client(make_client):
    """conftest's, with a generous cache_timeout_ms (and wait for a model's metadata, which
    its keys cover) unless a test sets its own."""

    def factory(pipelines: dict, env: dict[str, str], **settings):
        settings.setdefault("cache_timeout_ms", GENEROUS_CACHE_MS)
        settings.setdefault("ready_timeout_ms", GENEROUS_CACHE_MS)
        return make_client(pipelines, env, **settings)

    return factory


def cached(ttl_s: float = 60.0, **extra) -> dict:
    return {"p": pipeline([call("a", "plus1", "parse")], RESULT, cache={"ttl_s": ttl_s}, **extra)}


@pytest.fixture
def renders(monkeypatch) -> list[int]:
    """One entry for each result rendered from a run (Executor.result)."""
    made: list[int] = []
    render = Executor.result
    monkeypatch.setattr(Executor, "result", lambda self, run: made.append(1) or render(self, run))
    return made


def v2_request(data: bytes) -> dict:
    """A v2 REST request of `data` as the pipeline's BYTES input, base64 in JSON."""
    encoded = base64.b64encode(data).decode()
    tensor = {"name": "raw", "datatype": "BYTES", "shape": [1], "data": [encoded]}
    return {"inputs": [{**tensor, "parameters": {"content_type": "base64"}}]}


@pytest.fixture
async def chain(servers):
    model = affine("plus1", 1, 1, delay_s=0.05)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    return model, env


async def test_a_repeat_is_answered_from_the_cache(chain, make_client) -> None:
    model, env = chain
    async with make_client(cached(), env) as client:
        first = await post(client, "p", body(1, 2))
        second = await post(client, "p", body(1, 2))
        other = await post(client, "p", body(3))
    assert [r.status_code for r in (first, second, other)] == [200, 200, 200]
    assert [r.headers["X-Cache"] for r in (first, second, other)] == ["miss", "hit", "miss"]
    assert second.json()["result"] == first.json()["result"] == {"y": [2.0, 3.0]}
    assert other.json()["result"] == {"y": [4.0]}
    assert model.calls == 2  # the repeat never reached the service


async def test_each_lookup_is_counted_once_and_a_kept_answer_is_given_at_once(
    chain, make_client, monkeypatch
) -> None:
    """/v1 looks an upload's answer up before any task is made (Ticket.start): a hit is
    answered without a task watching its client, a miss is run with one and not looked up
    a second time, so each request counts one lookup."""
    watched: list[int] = []
    watch = rest.until_disconnect
    monkeypatch.setattr(
        rest, "until_disconnect", lambda request, work: watched.append(1) or watch(request, work)
    )
    model, env = chain
    pipes = {"counted": pipeline([call("a", "plus1", "parse")], RESULT, cache={"ttl_s": 60})}
    lookups = {r: metrics.CACHE_LOOKUPS.labels("counted", "", r) for r in ("hit", "miss", "error")}
    before = {r: c._value.get() for r, c in lookups.items()}
    async with make_client(pipes, env) as client:
        answers = [await post(client, "counted", body(9)) for _ in range(3)]
    assert [r.headers["X-Cache"] for r in answers] == ["miss", "hit", "hit"]
    assert [r.json()["result"] for r in answers] == [{"y": [10.0]}] * 3
    assert {r: c._value.get() - before[r] for r, c in lookups.items()} == {
        "hit": 2,
        "miss": 1,
        "error": 0,
    }
    assert len(watched) == 1  # the miss only
    assert model.calls == 1


async def test_a_hit_is_rendered_once_and_answers_as_the_miss_did(
    chain, make_client, renders
) -> None:
    """A hit's result is rendered on its first hit and kept as JSON; a cleared cache drops
    it with the entries."""
    model, env = chain
    async with make_client(cached(), env) as client:
        answers = [await post(client, "p", body(5, 6)) for _ in range(4)]
        rendered = len(renders)
        await client.delete("/v1/pipelines/p/cache")
        after = [await post(client, "p", body(5, 6)) for _ in range(3)]
    cache = [r.headers["X-Cache"] for r in answers + after]
    assert cache == ["miss", "hit", "hit", "hit", "miss", "hit", "hit"]
    assert all(r.json()["result"] == {"y": [6.0, 7.0]} for r in answers + after)
    assert rendered == 2  # the miss, then the first hit; later hits from the kept JSON
    assert len(renders) == 4  # after the clear: the miss, and the first hit again
    assert model.calls == 2


async def test_entries_expire(chain, make_client) -> None:
    model, env = chain
    async with make_client(cached(ttl_s=0.2), env) as client:
        await post(client, "p", body(1))
        await asyncio.sleep(0.3)
        again = await post(client, "p", body(1))
    assert again.headers["X-Cache"] == "miss" and model.calls == 2


async def test_identical_requests_in_flight_run_once(chain, make_client) -> None:
    model, env = chain
    async with make_client(cached(), env) as client:
        answers = await asyncio.gather(*(post(client, "p", body(7)) for _ in range(100)))
    assert all(r.status_code == 200 and r.json()["result"] == {"y": [8.0]} for r in answers)
    assert model.calls == 1
    assert sorted(r.headers["X-Cache"] for r in answers).count("miss") == 1


async def test_a_waiter_keeps_its_own_deadline(servers, make_client) -> None:
    slow = affine("plus1", 1, 1, delay_s=0.5)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(slow)}
    async with make_client(cached(), env) as client:
        patient = asyncio.ensure_future(post(client, "p", body(5)))
        await asyncio.sleep(0.05)
        hurried = await post(client, "p", body(5), **{"X-Request-Timeout-Ms": "100"})
        done = await patient
    assert hurried.status_code == 504
    assert done.status_code == 200 and done.json()["result"] == {"y": [6.0]}
    assert slow.calls == 1


async def test_partial_answers_and_errors_are_not_kept(servers, make_client) -> None:
    async def refuse(inputs, deadline):
        raise InvalidInput("no")

    good, bad = affine("good", 1, 1), ScriptedModel("bad", refuse)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(good, bad)}
    fan_out = partial_fan_out("both", "good", "bad")
    pipes = {
        "partial": pipeline([fan_out], {"ok": {"per_branch": "both", "fields": {"y": "y"}}}),
        "failing": pipeline([call("a", "bad", "parse")], RESULT),
    }
    for spec in pipes.values():
        spec["cache"] = True
    async with make_client(pipes, env) as client:
        partial = [await post(client, "partial", body(1)) for _ in range(2)]
        failed = [await post(client, "failing", body(1)) for _ in range(2)]
    assert [r.json()["partial"] for r in partial] == [True, True]
    assert [r.headers["X-Cache"] for r in partial] == ["miss", "miss"]
    assert [r.status_code for r in failed] == [400, 400]
    assert good.calls == 2 and bad.calls == 4


async def test_a_partial_answer_is_not_counted_as_refused(servers, make_client) -> None:
    """With `admit: second`, what would never be kept (a partial answer) is not offered to
    the doorkeeper: no answer counted as refused, its key not remembered."""

    async def refuse(inputs, deadline):
        raise InvalidInput("no")

    good, bad = affine("good", 1, 1), ScriptedModel("bad", refuse)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(good, bad)}
    fan_out = partial_fan_out("both", "good", "bad")
    result = {"ok": {"per_branch": "both", "fields": {"y": "y"}}}
    pipes = {"part2": pipeline([fan_out], result, cache={"admit": "second"})}
    unadmitted = metrics.CACHE_UNADMITTED.labels("part2", "")
    before = unadmitted._value.get()
    async with make_client(pipes, env) as client:
        answers = [await post(client, "part2", body(1)) for _ in range(3)]
    assert [r.json()["partial"] for r in answers] == [True] * 3
    assert [r.headers["X-Cache"] for r in answers] == ["miss"] * 3
    assert unadmitted._value.get() == before


async def _half_canary(
    servers, live: ScriptedModel, candidate: ScriptedModel
) -> tuple[dict[str, str], list[str], list[str]]:
    """Step `a`'s model with `candidate` as its canary at 50%: the endpoints, then two request
    ids the canary takes and two it leaves to the live model (by the canary's own rule)."""
    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(live),
        "MODELS_URL_CANARY": await servers(candidate),
        "MODELS_URL_CANARY_PERCENT": "50",
    }
    chooser = Canary(Target("MODELS_URL_CANARY", "127.0.0.1:1", "plus1"), 50)
    ids = [f"r-{i}" for i in range(40)]
    canary_ids = [i for i in ids if chooser.takes(i, "a")][:2]
    live_ids = [i for i in ids if not chooser.takes(i, "a")][:2]
    return env, canary_ids, live_ids


async def test_a_canarys_answers_are_not_kept_the_live_models_are(servers, make_client) -> None:
    """Half the calls go to a canary (another model): a request it answered is computed
    again when its input comes again, so a repeat under an id of the live model's share gets
    the live model's answer, never the canary's from the cache; the live model's answers are
    kept as ever."""
    live, candidate = affine("plus1", 1, 1), affine("plus1", 1, 100)
    env, (canary_id, _), (live_id, _) = await _half_canary(servers, live, candidate)
    async with make_client(cached(), env) as client:
        by_canary = [await post(client, "p", body(2), **{"X-Request-Id": canary_id})]
        by_canary.append(await post(client, "p", body(2), **{"X-Request-Id": canary_id}))
        by_live = [await post(client, "p", body(2), **{"X-Request-Id": live_id}) for _ in "ab"]
    assert [r.headers["X-Cache"] for r in by_canary] == ["miss", "miss"]
    assert [r.json()["result"] for r in by_canary] == [{"y": [102.0]}] * 2
    assert [r.headers["X-Cache"] for r in by_live] == ["miss", "hit"]
    assert [r.json()["result"] for r in by_live] == [{"y": [3.0]}] * 2
    assert (candidate.calls, live.calls) == (2, 1)


async def test_identical_requests_in_flight_share_a_run_only_with_ids_that_chose_alike(
    servers, make_client
) -> None:
    """Four identical requests in flight together, two under ids of the canary's share and
    two of the live model's: each gets the answer of the model its id chose (one run for
    each share), never the other share's from the shared computation."""
    live, candidate = affine("plus1", 1, 1, delay_s=0.3), affine("plus1", 1, 100, delay_s=0.3)
    env, canary_ids, live_ids = await _half_canary(servers, live, candidate)
    order = [canary_ids[0], live_ids[0], canary_ids[1], live_ids[1]]
    async with make_client(cached(), env) as client:
        answers = await asyncio.gather(
            *(post(client, "p", body(2), **{"X-Request-Id": i}) for i in order)
        )
    results = {i: r.json()["result"]["y"][0] for i, r in zip(order, answers, strict=True)}
    assert results == {**dict.fromkeys(canary_ids, 102.0), **dict.fromkeys(live_ids, 3.0)}
    assert (candidate.calls, live.calls) == (1, 1)
    assert sorted(r.headers["X-Cache"] for r in answers) == ["hit", "hit", "miss", "miss"]


async def test_a_new_model_version_never_answers_from_old_entries(servers, make_client) -> None:
    old = affine("plus1", 1, 1)
    server = await serve(old)
    port = server.port
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": f"127.0.0.1:{port}"}
    try:
        async with make_client(cached(), env, cache_check_ms=50) as client:
            before = [await post(client, "p", body(1)) for _ in range(2)]
            await server.stop(0)
            new = affine("plus1", 1, 10)
            new.version = "2"
            server = await serve(new, port=port)
            await asyncio.sleep(0.2)  # longer than the fingerprints' check period
            after = await post(client, "p", body(1))
    finally:
        await server.stop(0)
    assert [r.headers["X-Cache"] for r in before] == ["miss", "hit"]
    assert after.json()["result"] == {"y": [11.0]} and after.headers["X-Cache"] == "miss"


async def test_the_data_cache_is_shared_by_pipelines_calling_the_same_step(
    servers, make_client
) -> None:
    parse = parse_model()
    env = {
        "PARSE_URL": await servers(parse),
        "MODELS_URL": await servers(affine("plus1", 1, 1), affine("double", 2, 0)),
    }
    shared = {"cache": True}
    pipes = {
        "one": pipeline([call("a", "plus1", "parse")], RESULT),
        "two": pipeline([call("a", "double", "parse")], RESULT),
    }
    for spec in pipes.values():
        spec["steps"][0]["call"].update(shared)
    async with make_client(pipes, env) as client:
        one = await post(client, "one", body(4))
        two = await post(client, "two", body(4))
        cleared = await client.delete("/v1/pipelines/one/cache")
        again = await post(client, "two", body(4))
    assert one.json()["result"] == {"y": [5.0]} and two.json()["result"] == {"y": [8.0]}
    assert [s["cache"] for s in one.json()["steps"]] == ["miss", None]
    assert [s["cache"] for s in two.json()["steps"]] == ["hit", None]
    assert cleared.status_code == 200 and cleared.json()["cleared"] == 1
    assert again.json()["steps"][0]["cache"] == "miss"
    assert parse.calls == 2


async def test_clearing_a_pipeline_without_a_cache_is_a_404(chain, make_client) -> None:
    _, env = chain
    pipes = {"plain": pipeline([call("a", "plus1", "parse")], RESULT)}
    async with make_client(pipes, env) as client:
        answer = await client.delete("/v1/pipelines/plain/cache")
    assert answer.status_code == 404 and "has no cache" in answer.json()["error"]


async def test_v2_rest_answers_say_where_they_came_from(chain, make_client) -> None:
    model, env = chain
    request = v2_request(body(2))
    async with make_client(cached(), env) as client:
        first = await client.post("/v2/models/p/infer", json=request)
        second = await client.post("/v2/models/p/infer", json=request)
        stats = (await client.get("/v2/models/p/stats")).json()["model_stats"][0]
    assert first.json()["parameters"]["cache"] == "miss"
    assert second.json()["parameters"]["cache"] == "hit"
    # As on /v1: an answer from the cache ran no step.
    assert second.json()["parameters"]["partial"] is False
    assert json.loads(first.json()["parameters"]["steps"])[0]["name"] == "parse"
    assert json.loads(second.json()["parameters"]["steps"]) == []
    assert second.headers["X-Cache"] == "hit" and model.calls == 1
    counters = stats["inference_stats"]
    assert counters["cache_hit"]["count"] == 1 and counters["cache_miss"]["count"] == 1
    assert json.loads(second.json()["outputs"][0]["data"][0]) == {"y": [3.0]}


async def test_a_pipelines_statistics_count_every_doors_requests(chain, make_client) -> None:
    """Triton's statistics of a pipeline count its /v1 requests as its v2 ones: a miss, its
    hits, a failure, whichever door they came by (a Triton model's count every protocol)."""
    model, env = chain
    async with make_client(cached(), env) as client:
        miss = await post(client, "p", body(5))
        hit = await post(client, "p", body(5))
        on_v2 = await client.post("/v2/models/p/infer", json=v2_request(body(5)))
        failed = await post(client, "p", b"odd")  # not float32s: the parse step fails
        stats = (await client.get("/v2/models/p/stats")).json()["model_stats"][0]
    assert [miss.status_code, hit.status_code, on_v2.status_code] == [200, 200, 200]
    assert failed.status_code == 502 and model.calls == 1  # the step failed
    counters = stats["inference_stats"]
    assert counters["cache_miss"]["count"] == 1 and counters["cache_hit"]["count"] == 2
    assert counters["success"]["count"] == 3 and counters["fail"]["count"] == 1
    assert stats["execution_count"] == 1 and stats["inference_count"] == 1
    assert counters["compute_infer"]["count"] == 1 and counters["compute_infer"]["ns"] > 0


async def test_a_v2_hit_is_rendered_once_as_on_v1(chain, make_client, renders) -> None:
    """A v2 answer's `result` (the /v1 result as JSON) of a hit comes from the JSON kept for
    it, rendered on the first hit, whichever door asked first."""
    model, env = chain
    request = v2_request(body(4))
    async with make_client(cached(), env) as client:
        answers = [await client.post("/v2/models/p/infer", json=request) for _ in range(4)]
        on_v1 = await post(client, "p", body(4))
    assert [a.json()["parameters"]["cache"] for a in answers] == ["miss", "hit", "hit", "hit"]
    results = [json.loads(a.json()["outputs"][0]["data"][0]) for a in answers]
    assert results == [{"y": [5.0]}] * 4 and on_v1.json()["result"] == {"y": [5.0]}
    assert len(renders) == 2  # the miss, then the first hit; later hits, /v1's too, kept
    assert model.calls == 1


async def test_the_grpc_door_answers_from_the_cache(chain, tmp_path) -> None:
    import yaml
    from grpc import aio

    from protos import messages, pb, pb_grpc
    from proxy.doors.grpc_door import grpc_door
    from proxy.settings import ProxySettings
    from proxy.state import ProxyState

    model, env = chain
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump({"pipelines": cached()}))
    state = ProxyState.build(ProxySettings(pipelines=path), env)
    server = grpc_door(state, 0)
    await server.start()
    raw = np.array([body(3)], dtype=object)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = messages.build_request("p", {"raw": raw})
            answers = [await stub.ModelInfer(request, timeout=5) for _ in range(2)]
            stats = await stub.ModelStatistics(pb.ModelStatisticsRequest(name="p"), timeout=5)
    finally:
        await server.stop(0)
        await state.channels.close()
    assert [a.parameters["cache"].string_param for a in answers] == ["miss", "hit"]
    assert messages.response_outputs(answers[1])["result"][0] == b'{"y":[4.0]}'
    assert stats.model_stats[0].inference_stats.cache_hit.count == 1
    assert model.calls == 1


async def test_a_pipeline_keeping_no_answers_may_admit_its_steps_outputs_on_second_sighting(
    servers, make_client
) -> None:
    """`cache: {enabled: false, admit: second}`: no answer of the pipeline kept, its steps'
    outputs kept from their input's second sighting (a data cache alone keeps every one)."""
    parse = parse_model()
    plus1 = affine("plus1", 1, 1)
    env = {"PARSE_URL": await servers(parse), "MODELS_URL": await servers(plus1)}
    cache = {"enabled": False, "admit": "second"}
    pipes = {"p": pipeline([call("a", "plus1", "parse")], RESULT, cache=cache)}
    pipes["p"]["steps"][0]["call"]["cache"] = True
    async with make_client(pipes, env) as client:
        answers = [await post(client, "p", body(7)) for _ in range(3)]
    assert [r.json()["result"] for r in answers] == [{"y": [8.0]}] * 3
    assert [r.json()["steps"][0]["cache"] for r in answers] == ["miss", "miss", "hit"]
    assert all("X-Cache" not in r.headers for r in answers)
    assert (parse.calls, plus1.calls) == (2, 3)


async def test_a_flood_of_unique_requests_stays_within_the_bound(chain, make_client) -> None:
    from proxy import metrics

    _, env = chain
    pipes = {"flood": pipeline([call("a", "plus1", "parse")], RESULT, cache={"max_mb": 0.01})}
    async with make_client(pipes, env) as client:
        for i in range(60):
            answer = await post(client, "flood", body(*range(i, i + 200)))
            assert answer.status_code == 200 and answer.headers["X-Cache"] == "miss"
            held = metrics.CACHE_BYTES.labels("flood")._value.get()
            assert 0 < held <= 0.01 * 2**20
        early = await post(client, "flood", body(*range(0, 200)))  # long evicted
        late = await post(client, "flood", body(*range(59, 259)))  # the newest stays
    assert metrics.CACHE_EVICTIONS.labels("flood")._value.get() > 0
    assert early.headers["X-Cache"] == "miss" and late.headers["X-Cache"] == "hit"


async def test_admitted_on_second_sighting_an_answer_is_kept_when_its_input_comes_again(
    servers, make_client
) -> None:
    """`admit: second`: the first answer for an input is not kept (its key only remembered),
    the second is, the third request is a hit; the steps' outputs of that pipeline likewise,
    and another pipeline calling the same step then finds them kept."""
    parse = parse_model()
    plus1 = affine("plus1", 1, 1)
    env = {"PARSE_URL": await servers(parse), "MODELS_URL": await servers(plus1)}
    pipes = {
        "p": pipeline([call("a", "plus1", "parse")], RESULT, cache={"admit": "second"}),
        "q": pipeline([call("a", "plus1", "parse")], {"z": "a.y[0]"}),
    }
    for spec in pipes.values():
        spec["steps"][0]["call"]["cache"] = True
    unadmitted = metrics.CACHE_UNADMITTED.labels("p", "")
    before = unadmitted._value.get()
    async with make_client(pipes, env) as client:
        answers = [await post(client, "p", body(7)) for _ in range(3)]
        other = await post(client, "q", body(7))
    assert [r.json()["result"] for r in answers] == [{"y": [8.0]}] * 3
    assert [r.headers["X-Cache"] for r in answers] == ["miss", "miss", "hit"]
    assert [r.json()["steps"][0]["cache"] for r in answers[:2]] == ["miss", "miss"]
    assert other.json()["steps"][0]["cache"] == "hit"  # kept at p's second sighting
    assert (parse.calls, plus1.calls) == (2, 3)  # q has no cache of its answers
    assert unadmitted._value.get() - before == 1
