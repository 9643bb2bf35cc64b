"""TLS and mutual TLS on a real predictor process, and its healthcheck over TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from protos import pb, pb_grpc
from protos.tls import sync_channel
from tests.contract.test_predictor import infer
from tests.pki import PKI
from tests.procs import Service, run_module, start_service


def _start(test_repository: Path, workdir: Path, *flags: str) -> Service:
    return start_service(
        "predictors", ["--repository", str(test_repository), "--models", "linear", *flags], workdir
    )


@pytest.fixture(scope="module")
def tls_predictor(test_repository: Path, workdir: Path, pki: PKI) -> Iterator[Service]:
    service = _start(
        test_repository,
        workdir,
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
    )
    yield service
    service.stop()


@pytest.fixture(scope="module")
def mtls_predictor(test_repository: Path, workdir: Path, pki: PKI) -> Iterator[Service]:
    service = _start(
        test_repository,
        workdir,
        *("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
        *("--tls-client-ca", str(pki.ca)),
    )
    yield service
    service.stop()


def _ready(address: str, credentials: grpc.ChannelCredentials | None) -> bool:
    with sync_channel(address, credentials) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        return stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready


def test_tls_only(tls_predictor: Service, pki: PKI) -> None:
    trusted = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    with grpc.secure_channel(tls_predictor.address, trusted) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        x = np.ones((2, 4), np.float32)
        assert infer(stub, "linear", {"x": x})["y"].shape[0] == 2
    with pytest.raises(grpc.RpcError) as plaintext:
        _ready(tls_predictor.address, None)
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    # A certificate signed by a CA the caller does not trust is refused.
    with pytest.raises(grpc.RpcError) as untrusted:
        _ready(tls_predictor.address, grpc.ssl_channel_credentials(pki.other_ca.read_bytes()))
    assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate(mtls_predictor: Service, pki: PKI) -> None:
    with pytest.raises(grpc.RpcError) as anonymous:
        _ready(mtls_predictor.address, grpc.ssl_channel_credentials(pki.ca.read_bytes()))
    assert anonymous.value.code() == grpc.StatusCode.UNAVAILABLE
    identified = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
    )
    assert _ready(mtls_predictor.address, identified)


def test_healthcheck_over_tls(tls_predictor: Service, mtls_predictor: Service, pki: PKI) -> None:
    check = "v2server.healthcheck"
    assert run_module(check, [tls_predictor.address, "--tls-ca", str(pki.ca)]).returncode == 0
    assert run_module(check, [tls_predictor.address]).returncode == 1
    client = ["--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
    mtls = [mtls_predictor.address, "linear", "--tls-ca", str(pki.ca)]
    assert run_module(check, [*mtls, *client]).returncode == 0
    assert run_module(check, mtls).returncode == 1


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--tls-cert", "{server_cert}"], "tls_cert and tls_key go together"),
        (["--tls-cert", "{server_cert}", "--tls-key", "/nonexistent.key"], "/nonexistent.key"),
        (["--tls-cert", "{ca_key}", "--tls-key", "{server_key}"], "no PEM certificate"),
        (["--tls-cert", "{ca}", "--tls-key", "{server_key}"], "is the key the certificate"),
        (["--tls-client-ca", "{ca}"], "tls_client_ca needs tls_cert"),
    ],
)
def test_bad_tls_settings_fail_start_naming_them(
    test_repository: Path, pki: PKI, flags: list[str], named: str
) -> None:
    paths = {
        "server_cert": pki.server_cert,
        "server_key": pki.server_key,
        "ca": pki.ca,
        "ca_key": pki.ca.with_suffix(".key"),
    }
    args = [f.format(**paths) for f in flags]
    done = run_module("predictors", ["--repository", str(test_repository), "--port", "0", *args])
    assert done.returncode == 2, done.stderr
    assert "cannot start" in done.stderr and named in done.stderr
