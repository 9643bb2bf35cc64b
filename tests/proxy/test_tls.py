"""The proxy calls its services over TLS / mutual TLS when PROXY_TLS_* say so."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from protos.tls import TLSConfigError
from proxy.app import create_app
from proxy.settings import ProxySettings
from tests.pki import PKI
from tests.proxy.scripted import affine, serve
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post

PIPES = {"p": pipeline([call("a", "plus1", "parse")], {"y": "a.y[0]"})}


@pytest.fixture
async def mtls_env(pki: PKI):
    tls = {
        "tls_cert": pki.server_cert,
        "tls_key": pki.server_key,
        "tls_client_ca": pki.ca,
    }
    parse, models = await serve(parse_model(), **tls), await serve(affine("plus1", 1, 1), **tls)
    yield {"PARSE_URL": f"127.0.0.1:{parse.port}", "MODELS_URL": f"127.0.0.1:{models.port}"}
    await parse.stop(0)
    await models.stop(0)


async def test_pipeline_over_mutual_tls(mtls_env, make_client, pki: PKI) -> None:
    client_tls = {"tls_ca": pki.ca, "tls_cert": pki.client_cert, "tls_key": pki.client_key}
    async with make_client(PIPES, mtls_env, **client_tls) as client:
        r = await post(client, "p", body(2))
        ready = await client.get("/readyz")
    assert r.status_code == 200 and r.json()["result"] == {"y": [3.0]}
    assert ready.status_code == 200


@pytest.mark.parametrize("who", ["plaintext", "no client certificate", "untrusted CA"])
async def test_proxy_without_the_right_credentials_gets_503(
    mtls_env, make_client, pki: PKI, who: str
) -> None:
    settings = {
        "plaintext": {},
        "no client certificate": {"tls_ca": pki.ca},
        "untrusted CA": {
            "tls_ca": pki.other_ca,
            "tls_cert": pki.client_cert,
            "tls_key": pki.client_key,
        },
    }[who]
    async with make_client(PIPES, mtls_env, **settings) as client:
        r = await post(client, "p", body(2), **{"X-Request-Timeout-Ms": "1500"})
        ready = await client.get("/readyz")
    assert r.status_code == 503 and r.json()["step"] == "parse", r.text
    assert ready.status_code == 503


def test_half_a_client_certificate_fails_at_start(pki: PKI, tmp_path: Path) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(yaml.safe_dump({"pipelines": PIPES}))
    env = {"PARSE_URL": "127.0.0.1:1", "MODELS_URL": "127.0.0.1:1"}
    with pytest.raises(TLSConfigError, match="tls_cert and tls_key go together"):
        create_app(ProxySettings(pipelines=pipelines, tls_ca=pki.ca, tls_cert=pki.client_cert), env)
