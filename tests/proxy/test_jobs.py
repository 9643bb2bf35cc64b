"""Jobs through the in-process proxy (its workers running) on SQLite and on a real Redis,
against real gRPC servers: every endpoint, idempotency, cancel (a running job's calls too),
expiry, a full queue, attempts and their back-off, callbacks and their allow list, a
restart."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from protos.errors import InvalidInput, Unavailable
from proxy.jobs.callbacks import verify
from tests.callbacks import callbacks_received
from tests.proxy.scripted import ScriptedModel, affine
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post

RESULT = {"y": "a.y[0]"}
FINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def transport() -> str:
    """Jobs run on the default transport (the proxy's tests cover both)."""
    return "stream"


@pytest.fixture
def jobs_proxy(make_client, jobs_url: str) -> Callable[..., contextlib.AbstractAsyncContextManager]:
    """An in-process proxy (its lifespan run: its workers) on the test's jobs backend."""

    def factory(pipelines: dict, env: dict[str, str], **settings):
        settings.setdefault("jobs_url", jobs_url)
        settings.setdefault("jobs_workers", 4)
        return make_client(pipelines, env, **settings)

    return factory


async def submit(client: httpx.AsyncClient, name: str, data: bytes, **headers) -> httpx.Response:
    return await client.post(
        f"/v1/pipelines/{name}/jobs",
        content=data,
        headers={"Content-Type": "application/octet-stream", **headers},
    )


async def ended(client: httpx.AsyncClient, job_id: str, timeout: float = 10.0) -> dict:
    """The job once final (polled)."""
    until = time.monotonic() + timeout
    while True:
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        if job["status"] in FINAL:
            return job
        assert time.monotonic() < until, job
        await asyncio.sleep(0.02)


async def until_status(client: httpx.AsyncClient, job_id: str, status: str) -> dict:
    for _ in range(500):
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        if job["status"] == status:
            return job
        await asyncio.sleep(0.01)
    raise AssertionError(job)


@pytest.fixture
async def chain(servers):
    model = affine("plus1", 1, 1)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    return model, {"p": pipeline([call("a", "plus1", "parse")], RESULT)}, env


async def test_a_job_answers_what_infer_answers(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    async with jobs_proxy(pipes, env) as client:
        accepted = await submit(client, "p", body(1, 2))
        assert accepted.status_code == 202
        job = accepted.json()
        assert set(job) == {"id", "status", "pipeline", "created"}
        assert job["status"] == "queued" and job["pipeline"] == "p"
        assert accepted.headers["Location"] == f"/v1/jobs/{job['id']}"
        done = await ended(client, job["id"])
        direct = await post(client, "p", body(1, 2))
    assert done["status"] == "succeeded" and done["attempts"] == 1
    assert done["result"]["result"] == direct.json()["result"] == {"y": [2.0, 3.0]}
    assert done["result"]["pipeline"] == "p" and not done["result"]["partial"]
    assert [s["name"] for s in done["result"]["steps"]] == ["parse", "a"]


async def test_bad_requests_are_refused_at_once(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    async with jobs_proxy(pipes, env, jobs_workers=0) as client:
        unknown = await submit(client, "nope", body(1))
        empty = await submit(client, "p", b"")
        wrong_type = await submit(client, "p", body(1), **{"Content-Type": "text/plain"})
        budget = await submit(client, "p", body(1), **{"X-Request-Timeout-Ms": "soon"})
        listed = (await client.get("/v1/jobs")).json()
        bad_status = await client.get("/v1/jobs", params={"status": "done"})
        bad_limit = await client.get("/v1/jobs", params={"limit": "0"})
        bad_cursor = await client.get("/v1/jobs", params={"cursor": "x"})
        missing = await client.get("/v1/jobs/0123")
    assert unknown.status_code == 404 and "unknown pipeline 'nope'" in unknown.json()["error"]
    assert empty.status_code == 400 and "empty body" in empty.json()["error"]
    assert wrong_type.status_code == 415
    assert budget.status_code == 400 and "X-Request-Timeout-Ms" in budget.json()["error"]
    assert listed == {"jobs": [], "next": None}  # none of them was queued
    assert bad_status.status_code == 400 and "queued" in bad_status.json()["error"]
    assert bad_limit.status_code == 400 and bad_cursor.status_code == 400
    assert missing.status_code == 404 and "no job '0123'" in missing.json()["error"]


async def test_an_idempotency_key_gives_the_same_job(chain, jobs_proxy) -> None:
    model, pipes, env = chain
    async with jobs_proxy(pipes, env) as client:
        first = await submit(client, "p", body(4), **{"Idempotency-Key": "order-17"})
        again = await asyncio.gather(
            *(submit(client, "p", body(4), **{"Idempotency-Key": "order-17"}) for _ in range(5))
        )
        other_body = await submit(client, "p", body(5), **{"Idempotency-Key": "order-17"})
        await ended(client, first.json()["id"])
        later = await submit(client, "p", body(4), **{"Idempotency-Key": "order-17"})
        listed = (await client.get("/v1/jobs")).json()["jobs"]
    ids = {r.json()["id"] for r in [first, *again, later]}
    assert ids == {first.json()["id"]}
    assert all(r.status_code == 202 and r.headers["Idempotent-Replayed"] == "true" for r in again)
    assert "Idempotent-Replayed" not in first.headers
    assert later.json()["status"] == "succeeded"
    assert other_body.status_code == 422 and "order-17" in other_body.json()["error"]
    assert len(listed) == 1 and model.calls == 1


async def test_a_queued_job_is_cancelled(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    async with jobs_proxy(pipes, env, jobs_workers=0) as client:
        job_id = (await submit(client, "p", body(1))).json()["id"]
        cancelled = await client.delete(f"/v1/jobs/{job_id}")
        again = await client.delete(f"/v1/jobs/{job_id}")
        unknown = await client.delete("/v1/jobs/abc")
        shown = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert again.status_code == 409 and "cancelled" in again.json()["error"]
    assert unknown.status_code == 404
    assert shown["status"] == "cancelled" and shown["attempts"] == 0 and "finished" in shown


async def test_cancelling_a_running_job_cancels_its_calls(servers, jobs_proxy) -> None:
    slow = affine("plus1", 1, 1, delay_s=5.0)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(slow)}
    pipes = {"p": pipeline([call("a", "plus1", "parse")], RESULT)}
    async with jobs_proxy(pipes, env) as client:
        job_id = (await submit(client, "p", body(1))).json()["id"]
        await until_status(client, job_id, "running")
        for _ in range(300):
            if slow.calls:
                break
            await asyncio.sleep(0.01)
        cancelled = await client.delete(f"/v1/jobs/{job_id}")
        for _ in range(300):
            if slow.cancelled:
                break
            await asyncio.sleep(0.01)
        shown = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert slow.cancelled == 1  # the service saw its call cancelled, not run for 5 s
    assert shown["status"] == "cancelled" and "result" not in shown


async def test_a_full_queue_answers_429(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    async with jobs_proxy(pipes, env, jobs_workers=0, jobs_max_queued=2) as client:
        taken = [await submit(client, "p", body(i)) for i in range(2)]
        refused = await submit(client, "p", body(9))
        await client.delete(f"/v1/jobs/{taken[0].json()['id']}")
        room_again = await submit(client, "p", body(9))
    assert [r.status_code for r in taken] == [202, 202]
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert "queue is full" in refused.json()["error"]
    assert room_again.status_code == 202


async def test_ended_jobs_expire(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    async with jobs_proxy(pipes, env, jobs_keep_s=0.3) as client:
        job_id = (await submit(client, "p", body(1))).json()["id"]
        await ended(client, job_id)
        await asyncio.sleep(0.4)
        gone = await client.get(f"/v1/jobs/{job_id}")
        listed = (await client.get("/v1/jobs")).json()["jobs"]
    assert gone.status_code == 404 and listed == []


async def test_jobs_are_listed_by_pipeline_and_status_a_page_at_a_time(servers, jobs_proxy) -> None:
    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(affine("plus1", 1, 1)),
    }
    one = pipeline([call("a", "plus1", "parse")], RESULT)
    async with jobs_proxy({"p": one, "q": one}, env, jobs_workers=0) as client:
        ids = [
            (await submit(client, "p" if i % 2 else "q", body(i))).json()["id"] for i in range(7)
        ]
        await client.delete(f"/v1/jobs/{ids[1]}")
        pages, cursor = [], None
        while True:
            params = {"pipeline": "p", "limit": "2", **({"cursor": cursor} if cursor else {})}
            page = (await client.get("/v1/jobs", params=params)).json()
            pages.append([j["id"] for j in page["jobs"]])
            cursor = page["next"]
            if cursor is None:
                break
        queued = (await client.get("/v1/jobs", params={"status": "queued"})).json()["jobs"]
        cancelled = (await client.get("/v1/jobs", params={"status": "cancelled"})).json()["jobs"]
    assert pages == [[ids[5], ids[3]], [ids[1]]]  # newest first
    assert [j["id"] for j in queued] == [ids[6], ids[5], ids[4], ids[3], ids[2], ids[0]]
    assert [j["id"] for j in cancelled] == [ids[1]]


async def test_attempts_are_bounded_retried_and_the_last_error_kept(servers, jobs_proxy) -> None:
    failures = {"left": 4}

    async def flaky(inputs, deadline):
        if failures["left"]:
            failures["left"] -= 1
            raise Unavailable("warming up")
        return {"y": inputs["x"] + 1}

    async def refuse(inputs, deadline):
        raise InvalidInput("x is not a digit")

    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(ScriptedModel("flaky", flaky), ScriptedModel("bad", refuse)),
    }
    pipes = {
        "flaky": pipeline([call("a", "flaky", "parse")], RESULT),
        "bad": pipeline([call("a", "bad", "parse")], RESULT),
    }
    async with jobs_proxy(pipes, env, jobs_attempts=3, jobs_backoff_s=0.05) as client:
        recovers = (await submit(client, "flaky", body(1))).json()["id"]
        refused = (await submit(client, "bad", body(1))).json()["id"]
        recovered, failed = await ended(client, recovers), await ended(client, refused)
        failures["left"] = 10
        gives_up = await ended(client, (await submit(client, "flaky", body(1))).json()["id"])
    # Each attempt's step retries once: 4 failures take two attempts, the third answers.
    assert recovered["status"] == "succeeded" and recovered["attempts"] == 3
    assert recovered["result"]["result"] == {"y": [2.0]}
    assert failed["status"] == "failed" and failed["attempts"] == 1  # the input's fault
    assert failed["error"]["status"] == 400 and "not a digit" in failed["error"]["error"]
    assert gives_up["status"] == "failed" and gives_up["attempts"] == 3
    assert gives_up["error"]["status"] == 503 and "warming up" in gives_up["error"]["error"]


async def test_jobs_survive_a_restart(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    async with jobs_proxy(pipes, env, jobs_workers=0) as client:
        ids = [(await submit(client, "p", body(i))).json()["id"] for i in range(5)]
    async with jobs_proxy(pipes, env) as client:
        done = [await ended(client, i) for i in ids]
    assert [j["result"]["result"] for j in done] == [{"y": [i + 1.0]} for i in range(5)]


async def test_callbacks_are_retried_and_only_go_to_allowed_hosts(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    with callbacks_received(failures=2) as hook:
        port, received = int(hook.host.split(":")[1]), hook.bodies
        async with jobs_proxy(pipes, env, jobs_callback_hosts=hook.host) as client:
            url = hook.url
            job_id = (
                await client.post(
                    "/v1/pipelines/p/jobs",
                    params={"callback": url},
                    content=body(3),
                    headers={"Content-Type": "application/octet-stream"},
                )
            ).json()["id"]
            seen = []  # the callback's status as it goes
            for _ in range(500):
                shown = (await client.get(f"/v1/jobs/{job_id}")).json()
                status = shown.get("callback", {}).get("status")
                if status and status not in seen:
                    seen.append(status)
                if status == "delivered":
                    break
                await asyncio.sleep(0.02)
            refused = [
                await client.post(
                    "/v1/pipelines/p/jobs",
                    params={"callback": bad},
                    content=body(3),
                    headers={"Content-Type": "application/octet-stream"},
                )
                for bad in (
                    f"http://127.0.0.1:{port + 1}/x",  # another port
                    "http://169.254.169.254/latest/meta-data",  # the classic target
                    f"ftp://127.0.0.1:{port}/x",
                    f"http://user:pw@127.0.0.1:{port}/x",
                    "http://[::1/x",  # urllib refuses it outright
                    f"http://127.0.0.1:{port}0000/x",  # no such port
                    "http://" + "h" * 20_000 + "/x",
                )
            ]
    assert shown["callback"] == {"url": url, "status": "delivered"}
    assert seen == ["retrying: HTTP 500", "delivered"]
    assert len(received) == 3  # two failures, then delivered
    assert all(r["id"] == job_id and r["status"] == "succeeded" for r in received)
    assert received[-1]["result"]["result"] == {"y": [4.0]}
    assert [r.status_code for r in refused] == [400] * 7
    assert "not allowed" in refused[1].json()["error"]
    assert "is not a URL: Invalid IPv6 URL" in refused[4].json()["error"]
    assert "bad port" in refused[5].json()["error"]
    assert len(refused[6].json()["error"]) < 300  # the URL shown cut short


async def test_callbacks_are_signed_when_a_secret_is_set(chain, jobs_proxy) -> None:
    """A receiver tells a callback of the mesh from a forged, altered or replayed one:
    HMAC-SHA256 of "<t>.<body>" with the operator's secret (the scheme docs/jobs.md shows)."""
    _, pipes, env = chain
    secret = "s3cret-of-the-operator"
    with callbacks_received() as hook:
        settings = {"jobs_callback_hosts": hook.host, "jobs_callback_secret": secret}
        async with jobs_proxy(pipes, env, **settings) as client:
            job_id = (
                await client.post(
                    "/v1/pipelines/p/jobs",
                    params={"callback": hook.url},
                    content=body(3),
                    headers={"Content-Type": "application/octet-stream"},
                )
            ).json()["id"]
            for _ in range(500):
                if hook.sent:
                    break
                await asyncio.sleep(0.02)
    ((headers, raw),) = hook.sent
    fields = dict(part.split("=", 1) for part in headers["x-mesh-signature"].split(","))
    signed = f"{fields['t']}.".encode() + raw
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    assert fields["v1"] == expected and abs(time.time() - int(fields["t"])) < 60
    assert headers["x-mesh-job-id"] == job_id == json.loads(raw)["id"]
    # The helper a Python receiver may use says the same, and refuses the rest.
    header, now = headers["x-mesh-signature"], time.time()
    assert verify(secret.encode(), header, raw, now)
    assert not verify(b"another", header, raw, now)
    assert not verify(secret.encode(), header, raw.replace(b"succeeded", b"failed"), now)
    assert not verify(secret.encode(), header, raw, now + 3600)  # replayed an hour later
    assert not verify(secret.encode(), "t=x,v1=00", raw, now)


async def test_callbacks_are_off_without_allowed_hosts(chain, jobs_proxy) -> None:
    _, pipes, env = chain
    async with jobs_proxy(pipes, env) as client:
        refused = await client.post(
            "/v1/pipelines/p/jobs",
            params={"callback": "http://127.0.0.1:9/x"},
            content=body(3),
            headers={"Content-Type": "application/octet-stream"},
        )
    assert refused.status_code == 400 and "PROXY_JOBS_CALLBACK_HOSTS" in refused.json()["error"]


async def test_a_sync_async_pipeline_answers_now_and_later(servers, jobs_proxy) -> None:
    fast, slow = affine("fast", 1, 1), affine("slow", 10, 0, delay_s=0.2)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(fast, slow)}
    pipes = {
        "quick": pipeline([call("a", "fast", "parse")], RESULT, later="full"),
        "full": pipeline([call("a", "slow", "parse")], RESULT),
    }
    async with jobs_proxy(pipes, env) as client:
        now = await post(client, "quick", body(1, 2))
        later = now.json()["later"]
        done = await ended(client, later["job"])
        direct = await post(client, "full", body(1, 2))
        full_now = await post(client, "full", body(3))
    assert now.status_code == 200 and now.json()["result"] == {"y": [2.0, 3.0]}
    assert later == {"pipeline": "full", "job": done["id"], "location": f"/v1/jobs/{done['id']}"}
    assert done["status"] == "succeeded" and done["pipeline"] == "full"
    assert done["result"]["result"] == direct.json()["result"] == {"y": [10.0, 20.0]}
    assert "later" not in full_now.json()  # only the pipeline that declares it


async def test_a_sync_async_answers_later_part_calls_back_once_per_key(servers, jobs_proxy) -> None:
    """`?callback=` and Idempotency-Key on /infer go to its later part's job: the better
    answer is pushed, and a retried /infer names the same job instead of a second. A callback
    asked of a pipeline that answers only now is refused, not ignored."""
    fast, slow = affine("fast", 1, 1), affine("slow", 10, 0)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(fast, slow)}
    pipes = {
        "quick": pipeline([call("a", "fast", "parse")], RESULT, later="full"),
        "full": pipeline([call("a", "slow", "parse")], RESULT),
    }
    with callbacks_received() as hook:
        async with jobs_proxy(pipes, env, jobs_callback_hosts=hook.host) as client:

            async def infer(name: str, callback: str, key: str = "order-1") -> httpx.Response:
                return await client.post(
                    f"/v1/pipelines/{name}/infer",
                    params={"callback": callback},
                    content=body(5),
                    headers={"Content-Type": "application/octet-stream", "Idempotency-Key": key},
                )

            first, again = await infer("quick", hook.url), await infer("quick", hook.url)
            job_id = first.json()["later"]["job"]
            await ended(client, job_id)
            for _ in range(500):
                if hook.taken:
                    break
                await asyncio.sleep(0.02)
            calls_before = fast.calls
            elsewhere = await infer("quick", "http://169.254.169.254/x", key="order-2")
            answers_now = await infer("full", hook.url, key="order-3")
            calls_after = fast.calls
    assert first.status_code == again.status_code == 200
    assert first.json()["result"] == {"y": [6.0]}
    assert again.json()["later"]["job"] == job_id  # the same key, the same job
    (sent,) = hook.bodies
    assert sent["id"] == job_id and sent["pipeline"] == "full" and sent["status"] == "succeeded"
    assert sent["result"]["result"] == {"y": [50.0]}
    assert elsewhere.status_code == 400 and "not allowed" in elsewhere.json()["error"]
    assert calls_after == calls_before  # refused before anything ran
    assert answers_now.status_code == 400 and "answers now" in answers_now.json()["error"]


async def test_a_full_queue_leaves_the_fast_answer_standing(servers, jobs_proxy) -> None:
    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(affine("fast", 1, 1)),
    }
    pipes = {
        "quick": pipeline([call("a", "fast", "parse")], RESULT, later="full"),
        "full": pipeline([call("a", "fast", "parse")], RESULT),
    }
    async with jobs_proxy(pipes, env, jobs_workers=0, jobs_max_queued=1) as client:
        first = (await post(client, "quick", body(1))).json()
        second = await post(client, "quick", body(2))
    assert "job" in first["later"]
    assert second.status_code == 200 and second.json()["result"] == {"y": [3.0]}
    assert second.json()["later"]["error"]["status"] == 429


def test_later_must_name_another_pipeline_of_the_same_request(tmp_path: Path) -> None:
    from proxy.engine import plan
    from proxy.errors import DefinitionError

    env = {"PARSE_URL": "127.0.0.1:1", "MODELS_URL": "127.0.0.1:1"}
    one = pipeline([call("a", "fast", "parse")], RESULT)
    tensors = {**one, "inputs": {"raw": {"datatype": "BYTES", "shape": [1]}}}
    del tensors["input"]
    cases = [
        ({"p": {**one, "later": "nope"}}, "'nope' is no other pipeline"),
        ({"p": {**one, "later": "p"}}, "'p' is no other pipeline"),
        ({"p": {**one, "later": "q"}, "q": {**one, "later": "p"}}, "has a `later` of its own"),
        ({"p": {**one, "later": "q"}, "q": tensors}, "takes another kind of request"),
    ]
    for pipes, why in cases:
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump({"pipelines": pipes}))
        with pytest.raises(DefinitionError) as refused:
            plan.load(path, env)
        assert "pipeline 'p': later: " in str(refused.value) and why in str(refused.value)
