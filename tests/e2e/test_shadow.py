"""Shadow calls against real services: a candidate named by `<VARIABLE>_SHADOW` gets a copy of
every live call of its step, the agreement of its answers is counted output by output, and
nothing the client gets changes, whether the candidate answers, is gone or is frozen."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from bench.mesh import free_port
from compose.processes import start_service
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import photos, upload_type
from tests.procs import metric_of


def _post(client: httpx.Client, blob: bytes) -> httpx.Response:
    headers = {"Content-Type": upload_type(blob)}
    return client.post("/v1/pipelines/digits/infer", content=blob, headers=headers)


def _counted(url: str, step: str, total: float, *outcomes: str, wait_s: float = 15.0) -> None:
    """Wait until `step`'s copies of these outcomes add up to `total` (they end after the
    answers); fails naming what was counted."""
    deadline = time.monotonic() + wait_s
    while True:
        seen = {
            o: metric_of(url, "proxy_shadow_calls_total", pipeline="digits", step=step, outcome=o)
            for o in ("answered", "failed", "skipped")
        }
        if sum(seen[o] for o in outcomes) >= total or time.monotonic() > deadline:
            assert sum(seen[o] for o in outcomes) == total, (step, seen)
            return
        time.sleep(0.1)


def _outputs(url: str, step: str, output: str, outcome: str) -> float:
    return metric_of(
        url,
        "proxy_shadow_outputs_total",
        pipeline="digits",
        step=step,
        output=output,
        outcome=outcome,
    )


def test_a_shadow_gets_a_copy_of_every_call_and_counts_where_it_agrees(mesh: Mesh) -> None:
    """The MLP branch shadowed by the logistic regression (another model: its labels differ
    where the two models disagree) and the preprocessing by itself (the same model: every
    output the same)."""
    logreg = mesh.local.services["digits-logreg"].env["PREDICTOR_PORT"]
    preprocess = mesh.local.services["preprocess"].env["PREPROCESS_PORT"]
    env = {
        "PREDICTOR_DIGITS_MLP_URL_SHADOW": f"127.0.0.1:{logreg}/digits_logreg",
        "PREPROCESS_URL_SHADOW": f"127.0.0.1:{preprocess}",
    }
    images = photos(42, seed=11)
    with mesh.extra_proxy(free_port(), **env) as url, mesh.client() as plain:
        with httpx.Client(base_url=url, timeout=30) as client:
            answers = [_post(client, image) for image in images]
            listing = client.get("/v1/pipelines").json()["digits"]["shadows"]
        unshadowed = [_post(plain, image) for image in images]
        _counted(url, "ensemble/mlp", len(images), "answered")
        _counted(url, "preprocess", len(images), "answered")
        label = {o: _outputs(url, "ensemble/mlp", "label", o) for o in ("same", "differs")}
        probabilities = _outputs(url, "ensemble/mlp", "probabilities", "differs")
        preprocessed = {o: _outputs(url, "preprocess", "input", o) for o in ("same", "differs")}
    assert [a.status_code for a in answers] == [200] * len(images)
    # The client's answers are the live models' alone.
    assert [a.json()["result"] for a in answers] == [u.json()["result"] for u in unshadowed]
    members = [a.json()["result"]["members"] for a in answers]
    disagree = sum(m["mlp"]["label"] != m["logreg"]["label"] for m in members)
    assert label == {"same": len(images) - disagree, "differs": disagree}
    # Where both models are sure, their probabilities agree within the tolerance too.
    alike = sum(
        np.allclose(m["mlp"]["probabilities"], m["logreg"]["probabilities"], 1e-3, 1e-5)
        for m in members
    )
    assert probabilities == len(images) - alike
    assert preprocessed == {"same": len(images), "differs": 0}
    assert listing["ensemble/mlp"]["model"] == "digits_logreg"
    assert listing["preprocess"] == {
        **listing["preprocess"],
        "model": "digits_input",
        "percent": 100,
    }


def test_a_gone_or_frozen_shadow_changes_no_answer(mesh: Mesh, workdir: Path) -> None:
    """One branch's shadow is a port nobody listens on, the other's a candidate predictor
    frozen (SIGSTOP) after its first answers: every request is answered as without shadows,
    and the frozen candidate's copies stop at the bound (skipped) or fail at its budget,
    never holding a request."""
    candidate = start_service("predictors", ["--models", "digits_mlp"], workdir)
    env = {
        "PREDICTOR_DIGITS_MLP_URL_SHADOW": candidate.address,
        "PREDICTOR_DIGITS_LOGREG_URL_SHADOW": f"127.0.0.1:{free_port()}",
    }
    images = photos(130, seed=12)
    first, then = images[:10], images[10:]
    try:
        with mesh.extra_proxy(free_port(), **env) as url, mesh.client() as plain:
            with httpx.Client(base_url=url, timeout=30) as client:
                answers = [_post(client, image) for image in first]
                _counted(url, "ensemble/mlp", len(first), "answered")
                assert _outputs(url, "ensemble/mlp", "label", "same") == len(first)
                candidate.proc.send_signal(signal.SIGSTOP)
                with ThreadPoolExecutor(8) as pool:
                    answers += list(pool.map(lambda im: _post(client, im), then))
            unshadowed = [_post(plain, image) for image in images]
            # The frozen candidate's copies end at the pipeline's 3 s budget, or were never sent.
            _counted(url, "ensemble/mlp", len(then), "failed", "skipped")
            _counted(url, "ensemble/logreg", len(images), "failed", "skipped")
            answered = metric_of(
                url, "proxy_shadow_calls_total", step="ensemble/mlp", outcome="answered"
            )
    finally:
        candidate.proc.send_signal(signal.SIGCONT)
        candidate.stop()
    assert [a.status_code for a in answers] == [200] * 130
    for answer, alone in zip(answers, unshadowed, strict=True):
        # Concurrent requests' rows merged in other batches: the same up to rounding.
        got, expected = answer.json()["result"], alone.json()["result"]
        assert got["label"] == expected["label"]
        np.testing.assert_allclose(got["probabilities"], expected["probabilities"], atol=1e-5)
    assert answered == len(first)
