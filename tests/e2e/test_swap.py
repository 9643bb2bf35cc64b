"""Re-pointing a predictor by changing one environment variable of the proxy."""

from __future__ import annotations

import httpx
import numpy as np

from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out, png

PORT = 27080


def test_env_var_swaps_a_branch_to_another_server(mesh: Mesh) -> None:
    logreg = mesh.local.services["digits-logreg"].env["PREDICTOR_PORT"]
    # The "mlp" branch now asks the logistic-regression server for its model.
    swapped = {"PREDICTOR_DIGITS_MLP_URL": f"127.0.0.1:{logreg}/digits_logreg"}
    with mesh.extra_proxy(PORT, **swapped) as url:
        images, _ = held_out()
        r = httpx.post(
            f"{url}/v1/pipelines/digits/infer",
            content=png(images[5]),
            headers={"Content-Type": "image/png"},
            timeout=30,
        )
        listing = httpx.get(f"{url}/v1/pipelines", timeout=10).json()
    assert r.status_code == 200, r.text
    members = r.json()["result"]["members"]
    np.testing.assert_allclose(
        members["mlp"]["probabilities"], members["logreg"]["probabilities"], rtol=1e-6
    )
    target = listing["digits"]["targets"]["ensemble/mlp"]
    assert target["model"] == "digits_logreg" and target["address"].endswith(f":{logreg}")


def test_a_branch_swapped_for_a_model_with_other_inputs_is_named_as_the_meshs_fault(
    mesh: Mesh,
) -> None:
    """The recogniser takes a text line, not a digit's features: every call is refused with
    INVALID_ARGUMENT, which no client could fix. The answer says so (502, naming the model's
    inputs and what the pipeline sends), not 400; `digits-partial` still answers from the
    other branches, its failed one named the same way."""
    rec = mesh.local.services["ocr-rec"].env["PREDICTOR_PORT"]
    swapped = {"PREDICTOR_DIGITS_MLP_URL": f"127.0.0.1:{rec}/ocr_rec"}
    images, _ = held_out()
    body = png(images[5])
    with mesh.extra_proxy(PORT, **swapped) as url, httpx.Client(base_url=url, timeout=30) as c:
        headers = {"Content-Type": "image/png"}
        whole = c.post("/v1/pipelines/digits/infer", content=body, headers=headers)
        partial = c.post("/v1/pipelines/digits-partial/infer", content=body, headers=headers)
        blank = png(np.zeros_like(images[5]))
        no_ink = c.post("/v1/pipelines/digits/infer", content=blank, headers=headers)
    assert whole.status_code == 502, whole.text
    problem = whole.json()
    assert problem["step"] == "ensemble/mlp" and problem["code"] == "INTERNAL"
    assert "pipeline misconfigured: model 'ocr_rec'" in problem["error"]
    assert "has no input 'input'" in problem["error"]
    assert "the pipeline sends preprocess.input" in problem["error"]
    assert partial.status_code == 200 and partial.json()["partial"] is True
    [mlp] = [s for s in partial.json()["steps"] if s["name"] == "ensemble/mlp"]
    assert mlp["status"] == "internal" and "has no input 'input'" in mlp["error"]
    # A refusal the wiring does not explain (the preprocessing takes the image it is sent)
    # is still the client's own 400.
    assert no_ink.status_code == 400 and no_ink.json()["step"] == "preprocess", no_ink.text
    assert "no ink" in no_ink.json()["error"]
