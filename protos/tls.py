"""Optional TLS (and mutual TLS) between the proxy and the v2 services: one place that turns
certificate paths into gRPC credentials, for servers, the proxy's channels and healthchecks.
"""

from __future__ import annotations

from pathlib import Path

import grpc


class TLSConfigError(ValueError):
    """Certificate settings that cannot work; the message names the setting or file."""


def _read(path: Path, what: str, marker: bytes, kind: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"{what} {path}: {exc.strerror or exc}") from None
    if marker not in data:
        raise TLSConfigError(f"{what} {path}: no PEM {kind} in it")
    return data


def _cert(path: Path, what: str) -> bytes:
    return _read(path, what, b"-----BEGIN CERTIFICATE-----", "certificate")


def _key(path: Path, what: str) -> bytes:
    return _read(path, what, b"PRIVATE KEY-----", "private key")


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None = None
) -> grpc.ServerCredentials | None:
    """None for plaintext; with `client_ca`, callers must present a certificate it signed."""
    if cert is None and key is None:
        if client_ca is not None:
            raise TLSConfigError("tls_client_ca needs tls_cert and tls_key (the server's own)")
        return None
    if cert is None or key is None:
        raise TLSConfigError("tls_cert and tls_key go together: set both or neither")
    return grpc.ssl_server_credentials(
        [(_key(key, "tls_key"), _cert(cert, "tls_cert"))],
        root_certificates=None if client_ca is None else _cert(client_ca, "tls_client_ca"),
        require_client_auth=client_ca is not None,
    )


def channel_credentials(
    ca: Path | None, cert: Path | None = None, key: Path | None = None
) -> grpc.ChannelCredentials | None:
    """None for plaintext; `ca` verifies the services, `cert` + `key` identify the caller."""
    if ca is None:
        if cert is not None or key is not None:
            raise TLSConfigError("a client certificate needs tls_ca (to verify the services)")
        return None
    if (cert is None) != (key is None):
        raise TLSConfigError("tls_cert and tls_key go together: set both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_cert(ca, "tls_ca"),
        private_key=None if key is None else _key(key, "tls_key"),
        certificate_chain=None if cert is None else _cert(cert, "tls_cert"),
    )


def sync_channel(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    """A blocking-API channel, over TLS when `credentials` are given."""
    if credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials)
