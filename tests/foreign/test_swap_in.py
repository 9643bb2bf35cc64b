"""Any v2 server swaps in by one environment variable, on the default transport and on
unary calls: MLServer and KServe's model server each serve the digits MLP (our ONNX file,
their runtime) under the name `digits`, the name of a pipeline too, as a fourth branch of
the `digits` ensemble. Every request is answered, every branch right; told the rows the
server's model takes (`<VARIABLE>_MAX_BATCH_SIZE`: neither can say it), the proxy merges
concurrent requests' calls to it, and each member still gets its own answer."""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pytest

from bench.foreign.servers import NAME, Foreign
from proxy.transport.channels import Channels
from proxy.transport.failures import CallFailed
from proxy.transport.target import Target
from tests.conftest import Mesh
from tests.e2e.test_digits import held_out, png
from tests.report import report

TRANSPORTS = {
    "streams": {},
    "unary": {"PROXY_TRANSPORT": "unary", "PROXY_MERGE": "false"},
    # A server that cannot say its batch size (no ModelConfig), told by the variable: the
    # proxy merges concurrent requests' calls to it.
    "merged": {"PREDICTOR_DIGITS_FOREIGN_URL_MAX_BATCH_SIZE": "16"},
}


async def _ask(url: str, blobs: list[bytes], concurrency: int) -> list[httpx.Response]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(blob: bytes) -> httpx.Response:
            async with limit:
                return await client.post(
                    "/v1/pipelines/digits/infer",
                    content=blob,
                    headers={"Content-Type": "image/png"},
                )

        return await asyncio.gather(*(one(b) for b in blobs))


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_a_foreign_server_is_a_branch_of_the_ensemble(
    mesh: Mesh, foreign: Foreign, transport: str
) -> None:
    images, labels = held_out()
    blobs = [png(image) for image in images[:100]]
    env = {"PREDICTOR_DIGITS_FOREIGN_URL": f"{foreign.address}/{NAME}", **TRANSPORTS[transport]}
    with mesh.extra_proxy(27680, **env) as url:
        answers = asyncio.run(_ask(url, blobs, concurrency=8))
        again = asyncio.run(_ask(url, blobs[:20], concurrency=1))
        rows, calls = _merged(url, "ensemble/foreign")
    statuses = [a.status_code for a in answers + again]
    report(
        f"swap-in: {foreign.kind} as a fourth digits branch ({transport}): "
        f"{statuses.count(200)} of {len(statuses)} answered; {rows:.0f} rows in {calls:.0f} "
        "merged calls to it"
    )
    if transport == "merged":
        assert rows > calls, "no call to the foreign server carried more than one request"
    else:  # it says no batch size: each request's call goes alone
        assert calls == 0
    assert statuses == [200] * len(statuses), [a.text for a in answers if a.status_code != 200][:3]
    for answer in answers:
        members = answer.json()["result"]["members"]
        assert set(members) == {"logreg", "mlp", "forest", "foreign"}
        # The same ONNX file on both servers: the same answer, to float precision.
        assert members["foreign"]["label"] == members["mlp"]["label"]
        np.testing.assert_allclose(
            members["foreign"]["probabilities"], members["mlp"]["probabilities"], atol=1e-5
        )
    predicted = [a.json()["result"]["label"] for a in answers]
    assert sum(p == y for p, y in zip(predicted, labels[:100], strict=True)) >= 90


def _merged(url: str, step: str) -> tuple[float, float]:
    """Requests' calls carried, and merged calls made, to `step` (the proxy's metrics)."""
    text = httpx.get(f"{url}/metrics").text
    found = {"sum": 0.0, "count": 0.0}
    for kind in found:
        match = re.search(
            rf'^proxy_merged_call_members_{kind}{{step="{re.escape(step)}"}} (\S+)', text, re.M
        )
        found[kind] = float(match[1]) if match else 0.0
    return found["sum"], found["count"]


async def _first_contacts(address: str, rounds: int) -> list[str]:
    """`rounds` fresh proxies' transports, each sending its first 8 calls at once to a
    server: what each call ended with."""
    x = np.zeros((1, 64), np.float32)
    target = Target("PREDICTOR_DIGITS_FOREIGN_URL", address, NAME)
    outcomes: list[str] = []
    for r in range(rounds):
        channels = Channels(streams=2)

        async def one(key: str, channels: Channels = channels) -> str:
            try:
                await channels.infer(target, {"input": x}, timeout=5, request_id=key)
            except CallFailed as exc:
                return f"{exc.code().name}: {exc.details()}"
            return "answered"

        outcomes += await asyncio.gather(*(one(f"r{r}.{i}") for i in range(8)))
        await channels.close()
    return outcomes


def test_first_calls_to_a_server_without_streams_are_answered(kserve_server: Foreign) -> None:
    """KServe's server has no ModelStreamInfer: it answers UNIMPLEMENTED, and a write racing
    that answer fails INTERNAL, which hid the status for ~45% of first calls (each then failed
    503). Such a call goes unary instead, so none fails while the transport learns."""
    outcomes = asyncio.run(_first_contacts(kserve_server.address, rounds=20))
    failed = [o for o in outcomes if o != "answered"]
    assert not failed, failed[:3]
