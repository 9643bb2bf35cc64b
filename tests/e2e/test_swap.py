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
