"""`python -m v2server.healthcheck HOST:PORT [MODEL] [--tls-ca F [--tls-cert F --tls-key F]]`:
exit 0 when the v2 server is ready.

Used as the container healthcheck and, through compose/local.py, locally.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc

from protos import pb, pb_grpc
from protos.tls import TLSConfigError, channel_credentials, sync_channel


def ready(
    address: str,
    model: str = "",
    timeout: float = 2.0,
    credentials: grpc.ChannelCredentials | None = None,
) -> bool:
    with sync_channel(address, credentials) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            if model:
                return stub.ModelReady(pb.ModelReadyRequest(name=model), timeout=timeout).ready
            return stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout).ready
        except grpc.RpcError:
            return False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m v2server.healthcheck", description=__doc__)
    parser.add_argument("address")
    parser.add_argument("model", nargs="?", default="")
    parser.add_argument("--tls-ca", type=Path, help="CA of the server's certificate (TLS)")
    parser.add_argument("--tls-cert", type=Path, help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key", type=Path, help="client key (mutual TLS)")
    args = parser.parse_args(argv)
    try:
        credentials = channel_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    except TLSConfigError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 2
    return 0 if ready(args.address, args.model, credentials=credentials) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
