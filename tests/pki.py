"""A throwaway PKI for the TLS tests, made with the openssl command: a CA, a server
certificate for 127.0.0.1/localhost and a client certificate, plus a second, unrelated CA."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class PKI:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing here: trusting it must not be enough."""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(folder: Path, name: str) -> None:
    _openssl(
        "req", "-x509", *_EC, "-days", "2", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip


def _leaf(folder: Path, name: str, extensions: str) -> None:
    (folder / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", *_EC, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
        cwd=folder,
    )  # fmt: skip


def make_pki(folder: Path) -> PKI:
    _ca(folder, "ca")
    _ca(folder, "other")
    _leaf(
        folder,
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    _leaf(folder, "client", "extendedKeyUsage=clientAuth\n")
    return PKI(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_ca=folder / "other.pem",
    )
