"""Canaries against real services: `<VARIABLE>_CANARY` sends a share of a step's calls to
another model, by request id; the canary's answers, errors and latency are the client's, told
apart in the answer's steps and in the metrics."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as triton_http

from bench.mesh import free_port
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import photos, upload_type
from tests.procs import metric_of

CANARY = "PREDICTOR_DIGITS_MLP_URL_CANARY"


def _mlp(answer: httpx.Response) -> dict:
    [step] = [s for s in answer.json()["steps"] if s["name"] == "ensemble/mlp"]
    return step


def _v2_variant(url: str, blob: bytes, request_id: str) -> str:
    """The `ensemble/mlp` step's variant, as tritonclient gets it from the v2 REST door."""
    client = triton_http.InferenceServerClient(url.removeprefix("http://"), network_timeout=60)
    tensor = triton_http.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([blob], dtype=object))
    result = client.infer("digits", [tensor], headers={"X-Request-Id": request_id})
    steps = json.loads(result.get_response()["parameters"]["steps"])
    [mlp] = [s for s in steps if s["name"] == "ensemble/mlp"]
    return mlp["variant"]


def test_a_canary_answers_its_share_of_requests_the_same_on_every_try(
    mesh: Mesh, tmp_path: Path
) -> None:
    """Half of the MLP branch's calls go to the logistic regression's server: those answers
    carry its probabilities in the `mlp` member, the others the MLP's, and a request sent
    again under its id meets the same model, on `/v1` and on the v2 REST door alike. The
    prediction log records which model answered each, beside the upload's digest."""
    logreg = mesh.local.services["digits-logreg"].env["PREDICTOR_PORT"]
    env = {CANARY: f"127.0.0.1:{logreg}/digits_logreg", CANARY + "_PERCENT": "50"}
    env["PROXY_PREDICTION_LOG"] = str(tmp_path / "predictions.jsonl")
    images = photos(42, seed=13)
    with mesh.extra_proxy(free_port(), **env) as url, httpx.Client(base_url=url) as client:

        def post(i: int) -> httpx.Response:
            headers = {"Content-Type": upload_type(images[i]), "X-Request-Id": f"canary-test-{i}"}
            return client.post("/v1/pipelines/digits/infer", content=images[i], headers=headers)

        answers = [post(i) for i in range(len(images))]
        again = [post(i) for i in range(10)]
        over_v2 = [_v2_variant(url, images[i], f"canary-test-{i}") for i in range(6)]
        listing = client.get("/v1/pipelines").json()["digits"]["canaries"]
        counted = {
            v: metric_of(
                url, "proxy_canary_step_duration_seconds_count", step="ensemble/mlp", variant=v
            )
            for v in ("live", "canary")
        }
    assert [a.status_code for a in answers] == [200] * len(images)
    variants = [_mlp(a)["variant"] for a in answers]
    assert 5 <= variants.count("canary") <= 35, variants  # 50% of 40, by their ids
    for answer, variant in zip(answers, variants, strict=True):
        members = answer.json()["result"]["members"]
        same = np.allclose(members["mlp"]["probabilities"], members["logreg"]["probabilities"])
        assert same == (variant == "canary"), (variant, members)
    assert [_mlp(a)["variant"] for a in again] == variants[:10]
    assert over_v2 == variants[:6]  # the v2 door chooses by the same id, and says so
    every_call = variants + variants[:10] + over_v2
    assert counted == {v: every_call.count(v) for v in ("live", "canary")}
    assert listing["ensemble/mlp"]["model"] == "digits_logreg"
    assert listing["ensemble/mlp"]["percent"] == 50
    # Written once the proxy stopped: a record for each request, by id, in the order sent.
    records = [
        json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()
    ]
    assert len(records) == len(every_call)
    for record, answer, image in zip(records, answers, images, strict=False):
        assert record["id"] == answer.headers["X-Request-Id"]
        assert record["result"] == answer.json()["result"]
        assert record["inputs"]["image"]["sha256"] == [hashlib.sha256(image).hexdigest()]
    logged = [s for r in records for s in r["steps"] if s["name"] == "ensemble/mlp"]
    assert [s["variant"] for s in logged] == every_call
    models = {"canary": "digits_logreg", "live": "digits_mlp"}
    assert [s["model"] for s in logged] == [models[v] for v in every_call]
    # Each model's files by their SHA-256, as its service reports it: one digest a model,
    # the canary's the logistic regression's own (its branch's too), unlike the MLP's.
    digests: dict[str, set[str]] = {}
    for step in (s for r in records for s in r["steps"] if "model_sha256" in s):
        digests.setdefault(step["model"], set()).add(step["model_sha256"])
    assert set(digests) == {"digits_input", "digits_logreg", "digits_mlp", "digits_forest"}
    assert all(len(d) == 1 for d in digests.values()), digests
    assert digests["digits_logreg"] != digests["digits_mlp"]


def test_a_canary_that_does_not_fit_or_is_gone_fails_only_its_own_share(mesh: Mesh) -> None:
    """A canary at a model with other inputs: its calls fail as the mesh's fault (502, naming
    the canary's model, not the live one's), the live ones answer; `digits-partial` answers
    from the other branches. A canary nobody serves: its share fails UNAVAILABLE and the
    proxy is not ready (the canary answers clients), the live share answers."""
    rec = mesh.local.services["ocr-rec"].env["PREDICTOR_PORT"]
    misfit = {CANARY: f"127.0.0.1:{rec}/ocr_rec", CANARY + "_PERCENT": "50"}
    gone = {CANARY: f"127.0.0.1:{free_port()}", CANARY + "_PERCENT": "50"}
    body = photos(14, seed=14)[13]  # the suite's last look: a digit on a larger canvas
    for env, code, status in ((misfit, 502, "internal"), (gone, 503, "unavailable")):
        with (
            mesh.extra_proxy(free_port(), wait_for="/healthz", **env) as url,
            httpx.Client(base_url=url, timeout=30) as client,
        ):
            answers = {
                pipeline: [
                    client.post(
                        f"/v1/pipelines/{pipeline}/infer",
                        content=body,
                        headers={"Content-Type": upload_type(body), "X-Request-Id": f"r-{i}"},
                    )
                    for i in range(16)
                ]
                for pipeline in ("digits", "digits-partial")
            }
            ready = client.get("/readyz")
        whole, partial = answers["digits"], answers["digits-partial"]
        failed = [a for a in whole if a.status_code != 200]
        assert 0 < len(failed) < len(whole), [a.status_code for a in whole]
        assert {a.status_code for a in failed} == {code}
        if code == 502:
            assert "model 'ocr_rec'" in failed[0].json()["error"]
        # The same ids took the canary in both pipelines: there the partial one lacks `mlp`.
        for one, other in zip(whole, partial, strict=True):
            assert other.status_code == 200
            took_canary = one.status_code != 200
            assert other.json()["partial"] is took_canary
            if took_canary:
                assert _mlp(other) == {**_mlp(other), "variant": "canary", "status": status}
        assert ready.status_code == (503 if code == 503 else 200), ready.text
