"""`python -m v2server.healthcheck HOST:PORT [MODEL]`: exit 0 when the v2 server is ready.

Used as the container healthcheck and, through compose/local.py, locally.
"""

from __future__ import annotations

import sys

import grpc

from protos import pb, pb_grpc


def ready(address: str, model: str = "", timeout: float = 2.0) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            if model:
                return stub.ModelReady(pb.ModelReadyRequest(name=model), timeout=timeout).ready
            return stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout).ready
        except grpc.RpcError:
            return False


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    return 0 if ready(*argv) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
