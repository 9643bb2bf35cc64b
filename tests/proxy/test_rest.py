"""The proxy's REST surface: status mapping, limits, ids, health, metrics, v2 REST."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from tests.proxy.scripted import affine, serve
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post


@pytest.fixture
async def env():
    parse, models = await serve(parse_model()), await serve(affine("plus1", 1, 1))
    yield {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{models.port}"}
    await parse.stop(0)
    await models.stop(0)


PIPES = {"p": pipeline([call("a", "plus1", "parse")], {"y": "a.y[0]"})}


async def test_answer_shape_and_request_id(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        r = await post(client, "p", body(1), **{"X-Request-Id": "abc-123"})
    data = r.json()
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "abc-123"
    assert set(data) == {"id", "pipeline", "result", "partial", "steps", "latency_ms"}
    assert data["id"] == "abc-123" and data["pipeline"] == "p"
    keys = {"name", "status", "latency_ms", "error", "cache", "start_ms", "variant"}
    assert all(set(s) == keys for s in data["steps"])
    assert "X-Cache" not in r.headers  # no cache declared


async def test_multipart_upload(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        r = await client.post("/v1/pipelines/p/infer", files={"file": ("x.bin", body(2))})
        missing = await client.post("/v1/pipelines/p/infer", files={"other": ("x", b"1")})
    assert r.status_code == 200 and r.json()["result"] == {"y": [3.0]}
    assert missing.status_code == 422 and "'file'" in missing.json()["error"]


@pytest.mark.parametrize(
    ("path", "data", "headers", "status", "text"),
    [
        ("/v1/pipelines/nope/infer", b"x", {}, 404, "unknown pipeline 'nope'"),
        ("/v1/pipelines/p/infer", b"", {}, 400, "empty body"),
        ("/v1/pipelines/p/infer", b"x" * 2048, {}, 413, "exceeds the limit"),
        ("/v1/pipelines/p/infer", b"x", {"Content-Type": "text/plain"}, 415, "Content-Type"),
        ("/v1/pipelines/p/infer", b"x", {"X-Request-Timeout-Ms": "soon"}, 400, "milliseconds"),
        ("/v1/pipelines/p/infer", b"x", {"X-Request-Timeout-Ms": "-5"}, 400, "positive"),
        # Starlette's own errors come in the same shape as ours.
        ("/v1/nothing", b"x", {}, 404, "Not Found"),
        ("/v1/pipelines/p/infer", b"x", {"Content-Type": "multipart/form-data"}, 400, "multipart"),
    ],
)
async def test_bad_requests_are_named(env, make_client, path, data, headers, status, text) -> None:
    async with make_client(PIPES, env, max_body_mb=1 / 1024) as client:
        r = await client.post(
            path, content=data, headers={"Content-Type": "application/octet-stream", **headers}
        )
    assert r.status_code == status, r.text
    assert text in r.json()["error"] and r.json()["id"]
    assert r.headers["X-Request-Id"] == r.json()["id"]  # once, not once per layer


async def test_other_methods_and_paths_near_the_infer_route(env, make_client) -> None:
    """The infer route is answered ahead of FastAPI's router; everything else still goes
    through it, in the same error shape."""
    async with make_client(PIPES, env) as client:
        get = await client.get("/v1/pipelines/p/infer")
        nested = await client.post("/v1/pipelines/p/x/infer", content=body(1))
        bare = await client.post("/v1/pipelines//infer", content=body(1))
        ok = await post(client, "p", body(1))
    assert get.status_code == 405 and get.json()["id"] and get.headers["allow"] == "POST"
    assert nested.status_code == 404 and bare.status_code == 404
    assert ok.status_code == 200


async def test_a_bug_answers_500_in_our_shape_and_the_proxy_goes_on(
    env, make_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.engine.executor import Executor

    def broken(self: Executor, run: object) -> object:
        raise RuntimeError("a bug")

    async with make_client(PIPES, env) as client:
        with monkeypatch.context() as patch:
            patch.setattr(Executor, "result", broken)
            r = await post(client, "p", body(1), **{"X-Request-Id": "bug-1"})
        after = await post(client, "p", body(1))
    assert r.status_code == 500 and r.json() == {
        "error": "internal error (see the proxy log)",
        "id": "bug-1",
    }
    assert r.headers["X-Request-Id"] == "bug-1"
    assert after.status_code == 200


async def test_downstream_invalid_input_is_400_naming_the_step(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        r = await post(client, "p", b"abc")  # 3 bytes: not float32 data
    assert r.status_code in (400, 502)
    assert r.json()["step"] == "parse"


async def test_health_ready_metrics_listing_and_docs(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        assert (await client.get("/healthz")).json() == {"live": True}
        ready = await client.get("/readyz")
        await post(client, "p", body(1))
        metrics = (await client.get("/metrics")).text
        listing = (await client.get("/v1/pipelines")).json()
        docs = await client.get("/docs")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert 'proxy_requests_total{pipeline="p",status="200"}' in metrics
    assert "proxy_step_duration_seconds_bucket" in metrics
    assert listing["p"]["targets"]["a"]["model"] == "plus1"
    assert docs.status_code == 200


async def test_readyz_names_what_is_not_ready(env, make_client) -> None:
    async with make_client(
        PIPES, {**env, "MODELS_URL": "127.0.0.1:9"}, ready_timeout_ms=300
    ) as client:
        r = await client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["endpoints"]["MODELS_URL/plus1"]["ready"] is False
    assert r.json()["endpoints"]["PARSE_URL/parse"]["ready"] is True


async def test_readiness_asks_the_services_once_per_period_however_many_poll(
    env, make_client
) -> None:
    """Pollers share one fan-out per PROXY_READY_CACHE_MS (it once cost ~17 ms of the mesh's
    CPU per call, and eight pollers halved normal throughput); after the period the
    services are asked again."""
    from v2server import metrics as service_metrics

    def asked() -> float:
        return service_metrics.REQUESTS.labels("ServerReady", "", "OK")._value.get()

    # A period of a minute, which no slow machine's 176 polls outlast (a 2 s period once
    # did on CI's two busy cores, and a second fan-out was counted).
    async with make_client(PIPES, env, ready_cache_ms=60_000) as client:
        before = asked()
        polls = await asyncio.gather(*(client.get("/readyz") for _ in range(64)))
        polls += await asyncio.gather(*(client.get("/v2/health/ready") for _ in range(64)))
        for _ in range(3):
            polls += await asyncio.gather(*(client.get("/readyz") for _ in range(16)))
        fan_outs = asked() - before
    assert {p.status_code for p in polls} == {200}
    # Two endpoints: one call each for /readyz's fan-out and one for /v2/health/ready's.
    assert 2 <= fan_outs <= 4, fan_outs
    # After the period the services are asked again.
    async with make_client(PIPES, env, ready_cache_ms=100) as client:
        first = await client.get("/readyz")
        once = asked()
        await asyncio.sleep(0.15)
        again = await client.get("/readyz")
    assert first.status_code == again.status_code == 200 and asked() > once


async def test_api_key(env, make_client) -> None:
    async with make_client(PIPES, env, api_key="s3cret") as client:
        denied = await post(client, "p", body(1))
        allowed = await post(client, "p", body(1), Authorization="Bearer s3cret")
        other = await post(client, "p", body(1), **{"X-API-Key": "s3cret"})
        # A browser's: HTTP Basic, the key as the password (the user name is not read).
        basic = await client.get("/v1/pipelines", auth=("anyone", "s3cret"))
        wrong = await client.get("/v1/pipelines", auth=("anyone", "s3cre"))
        garbled = await client.get("/v1/pipelines", headers={"Authorization": "Basic %%%"})
        health = await client.get("/healthz")
    assert denied.status_code == 401 and allowed.status_code == 200 and other.status_code == 200
    assert basic.status_code == 200
    assert wrong.status_code == 401 and garbled.status_code == 401
    # RFC 9110: a 401 says how to authenticate (a browser then asks for the key).
    assert denied.headers["WWW-Authenticate"].startswith("Basic realm=")
    assert health.status_code == 200


async def test_a_browser_page_of_an_allowed_origin_may_call_and_read_the_answer(
    env, make_client
) -> None:
    """PROXY_CORS_ORIGINS: the preflight is answered before the API key is asked for (a
    browser sends none with it), the answer's headers are readable by the page, and an
    origin not named gets no CORS headers, which browsers take as a refusal."""
    app_origin = "https://app.example.com"
    async with make_client(PIPES, env, api_key="s3cret", cors_origins=app_origin) as client:
        preflight = await client.options(
            "/v1/pipelines/p/infer",
            headers={
                "Origin": app_origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        answer = await post(client, "p", body(1), Authorization="Bearer s3cret", Origin=app_origin)
        keyless = await post(client, "p", body(1), Origin=app_origin)
        stranger = await post(
            client, "p", body(1), Authorization="Bearer s3cret", Origin="https://evil.example"
        )
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == app_origin
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert "authorization" in preflight.headers["Access-Control-Allow-Headers"].lower()
    assert answer.status_code == 200
    assert answer.headers["Access-Control-Allow-Origin"] == app_origin
    exposed = answer.headers["Access-Control-Expose-Headers"]
    assert "X-Request-Id" in exposed and "Retry-After" in exposed
    assert keyless.status_code == 401  # CORS opens no door the API key closes
    assert keyless.headers["Access-Control-Allow-Origin"] == app_origin  # the page reads why
    assert stranger.status_code == 200
    assert "Access-Control-Allow-Origin" not in stranger.headers


async def test_without_cors_origins_no_cors_headers(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        answer = await post(client, "p", body(1), Origin="https://app.example.com")
    assert answer.status_code == 200
    assert not [h for h in answer.headers if h.lower().startswith("access-control-")]


async def test_v2_rest_protocol(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        meta = await client.get("/v2/models/plus1")
        r = await client.post(
            "/v2/models/plus1/infer",
            json={
                "id": "q1",
                "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}],
            },
        )
        bad = await client.post(
            "/v2/models/plus1/infer",
            json={"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1]}]},
        )
        unknown = await client.get("/v2/models/nothing")
        live = await client.get("/v2/health/live")
    assert meta.status_code == 200 and meta.json()["inputs"][0]["shape"] == [-1, -1]
    out = r.json()
    assert r.status_code == 200 and out["id"] == "q1"
    assert out["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [2.5, 3.5]}
    ]
    assert bad.status_code == 400 and "do not fill shape" in bad.json()["error"]
    assert unknown.status_code == 404
    assert live.json() == {"live": True}
    assert np.isclose(out["outputs"][0]["data"][0], 2.5)


async def test_odd_request_ids_are_replaced(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        r = await post(client, "p", body(1), **{"X-Request-Id": "x" * 5000})
    assert r.status_code == 200 and len(r.headers["X-Request-Id"]) == 32


async def test_v2_rest_echoes_any_id_without_sending_it_downstream(env, make_client) -> None:
    async with make_client(PIPES, env) as client:
        for odd in ["line\nbreak é", "x" * 20_000]:
            r = await client.post(
                "/v2/models/plus1/infer",
                json={
                    "id": odd,
                    "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}],
                },
            )
            assert r.status_code == 200, r.text
            assert r.json()["id"] == odd


async def test_a_bug_is_answered_inside_the_server_so_the_connection_survives() -> None:
    """An exception no handler knows becomes our 500 in RequestContext, and the ASGI call
    returns normally: uvicorn closes a keep-alive connection when the app raises, and
    the client's next request on it would fail."""
    from proxy.doors.middleware import RequestContext

    async def broken(scope, receive, send):
        raise RuntimeError("a bug")

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/x", "method": "GET", "headers": []}
    await RequestContext(broken, api_key=None, open_paths=set())(scope, receive, send)
    assert sent[0]["status"] == 500
    assert b"internal error" in sent[1]["body"]
    assert any(name == b"x-request-id" for name, _ in sent[0]["headers"])


async def test_the_docs_load_nothing_from_outside(env, make_client) -> None:
    """/docs and /redoc name only the proxy's own assets (they used to load Swagger UI from a
    CDN: a blank page offline), and every one of them is served."""
    async with make_client(PIPES, env) as client:
        for page in ("/docs", "/redoc"):
            html = (await client.get(page)).text
            urls = re.findall(r"""(?:src|href)\s*[=:]\s*['"]([^'"]+)['"]""", html)
            urls += re.findall(r"""url:\s*['"]([^'"]+)['"]""", html)
            assert urls, html
            assert not [u for u in urls if "//" in u], urls
            for url in urls:
                answer = await client.get(url)
                assert answer.status_code == 200 and len(answer.content) > 100, url
