"""What the console page reads, through the in-process proxy: each step's start in the
answer (a waterfall's offsets), the last requests with their steps and statuses, the live
percentiles, and the page's own files behind the API key."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np

from protos.errors import InvalidInput
from tests.proxy.scripted import ScriptedModel, affine
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post


def picky(name: str) -> ScriptedModel:
    """x + 1, refusing any value over 100 (INVALID_ARGUMENT: the request's 400)."""

    async def fn(inputs, deadline):
        if (inputs["x"] > 100).any():
            raise InvalidInput(f"{name} takes values up to 100")
        await asyncio.sleep(0.005)  # a step long enough to show on a waterfall
        return {"y": (inputs["x"] + 1).astype(np.float32)}

    return ScriptedModel(name, fn)


CHAIN = {
    "chain": pipeline(
        [call("a", "picky", "parse"), call("b", "double", "a")], {"y": "b.y[0]"}, timeout_ms=5000
    )
}


async def _env(servers) -> dict[str, str]:
    return {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(picky("picky"), affine("double", 2, 0)),
    }


async def test_steps_say_when_they_began(servers, make_client) -> None:
    async with make_client(CHAIN, await _env(servers)) as client:
        r = await post(client, "chain", body(1, 2))
    answer = r.json()
    assert r.status_code == 200 and answer["result"] == {"y": [4.0, 6.0]}
    steps = answer["steps"]
    assert [s["name"] for s in steps] == ["parse", "a", "b"]
    # In series: each begins once the one before has ended, all within the request.
    for before, after in itertools.pairwise(steps):
        assert after["start_ms"] >= before["start_ms"] + before["latency_ms"] - 0.01
    last = steps[-1]
    assert (
        steps[0]["start_ms"] >= 0
        and last["start_ms"] + last["latency_ms"] <= answer["latency_ms"] + 1.0
    )


async def test_the_last_requests_newest_first_with_their_steps(servers, make_client) -> None:
    async with make_client(CHAIN, await _env(servers)) as client:
        ok = await post(client, "chain", body(1), **{"X-Request-Id": "first"})
        bad = await post(client, "chain", body(500), **{"X-Request-Id": "second"})
        listed = await client.get("/v1/console/requests")
        one = await client.get("/v1/console/requests", params={"limit": 1})
        other = await client.get("/v1/console/requests", params={"pipeline": "nope"})
    assert ok.status_code == 200 and bad.status_code == 400, bad.text
    requests = listed.json()["requests"]
    assert [(r["id"], r["pipeline"], r["status"]) for r in requests] == [
        ("second", "chain", "400"),
        ("first", "chain", "200"),
    ]
    failed, answered = requests
    # The failed request still tells its steps: parse ran, `a` failed and `b` never ran.
    assert [(s["name"], s["status"]) for s in failed["steps"]] == [
        ("parse", "ok"),
        ("a", "invalid_argument"),
    ]
    assert "up to 100" in failed["steps"][1]["error"]
    assert answered["steps"] == ok.json()["steps"]
    # The same start; the console's record ends after the answer is made.
    assert answered["latency_ms"] >= ok.json()["latency_ms"] > 0
    assert [r["id"] for r in one.json()["requests"]] == ["second"]
    assert other.json() == {"requests": []}


async def test_live_percentiles_per_step(servers, make_client) -> None:
    async with make_client(CHAIN, await _env(servers)) as client:
        for i in range(20):
            await post(client, "chain", body(i))
        await post(client, "chain", body(500))  # failed: not in the figures of `a`
        r = await client.get("/v1/console/latency")
    report = r.json()
    assert report["window_s"] == 60
    figures = report["pipelines"]["chain"]
    assert set(figures) == {"(request)", "parse", "a", "b"}
    assert figures["a"]["count"] == 20 and figures["(request)"]["count"] == 20
    assert figures["parse"]["count"] == 21
    for step in figures.values():
        assert 0 < step["p50_ms"] <= step["p99_ms"]
    # `a` sleeps 5 ms a call: its median cannot be less, and the request holds all three.
    assert figures["a"]["p50_ms"] >= 5.0
    assert figures["(request)"]["p50_ms"] >= figures["a"]["p50_ms"]


async def test_bad_limits_are_400(servers, make_client) -> None:
    async with make_client(CHAIN, await _env(servers)) as client:
        answers = [
            await client.get("/v1/console/requests", params={"limit": limit})
            for limit in ("0", "-1", "x", "1001")
        ]
    for answer in answers:
        assert answer.status_code == 400 and "limit must be" in answer.json()["error"]


async def test_the_page_is_served_behind_the_key(servers, make_client) -> None:
    async with make_client(CHAIN, await _env(servers), api_key="s3cret") as client:
        denied = await client.get("/console/")
        bare = await client.get("/console", auth=("", "s3cret"))
        page = await client.get("/console/", auth=("", "s3cret"))
        script = await client.get("/console/console.js", auth=("", "s3cret"))
        feed = await client.get("/v1/console/latency")
    assert denied.status_code == 401 and "Basic" in denied.headers["WWW-Authenticate"]
    assert bare.status_code == 307 and bare.headers["location"].endswith("/console/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    # Every file the page names is served by the proxy itself (no CDN).
    for name in ("console.css", "waterfall.js", "answers.js", "console.js"):
        assert f'"{name}"' in page.text
    assert script.status_code == 200 and "v1/console/latency" in script.text
    # Nothing but the proxy's own files may run or be fetched, and no page may frame it.
    for answer in (page, script):
        policy = answer.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert feed.status_code == 401


async def test_the_console_can_be_turned_off(servers, make_client) -> None:
    async with make_client(CHAIN, await _env(servers), console=False) as client:
        await post(client, "chain", body(1))
        page = await client.get("/console/")
        feed = await client.get("/v1/console/requests")
    assert page.status_code == 404 and feed.status_code == 404
