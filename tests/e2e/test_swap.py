"""Re-pointing a predictor by changing one environment variable of the proxy."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import numpy as np

from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out, png
from tests.procs import ROOT

PORT = 27080


def test_env_var_swaps_a_branch_to_another_server(mesh: Mesh) -> None:
    env = {**os.environ, **mesh.local.services["proxy"].env, "PROXY_PORT": str(PORT)}
    logreg = mesh.local.services["digits-logreg"].env["PREDICTOR_PORT"]
    # The "mlp" branch now asks the logistic-regression server for its model.
    env["PREDICTOR_DIGITS_MLP_URL"] = f"127.0.0.1:{logreg}/digits_logreg"
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{PORT}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proxy.poll() is None, "proxy not ready"
            time.sleep(0.2)
        images, _ = held_out()
        r = httpx.post(
            f"{url}/v1/pipelines/digits/infer",
            content=png(images[5]),
            headers={"Content-Type": "image/png"},
            timeout=30,
        )
        listing = httpx.get(f"{url}/v1/pipelines", timeout=10).json()
    finally:
        proxy.terminate()
        proxy.wait(30)
    assert r.status_code == 200, r.text
    members = r.json()["result"]["members"]
    np.testing.assert_allclose(
        members["mlp"]["probabilities"], members["logreg"]["probabilities"], rtol=1e-6
    )
    target = listing["digits"]["targets"]["ensemble/mlp"]
    assert target["model"] == "digits_logreg" and target["address"].endswith(f":{logreg}")
