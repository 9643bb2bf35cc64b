"""The wire schema of the mesh: the Open Inference Protocol v2 over gRPC.

`pb` holds the messages, `pb_grpc` the service stubs, `codec` the one numpy <-> v2
tensor codec and `messages` whole requests and answers; `wire` splices tensor bytes into
messages without copies; `channels`, `tls`, `errors`, `logs`, `media` are what both sides
of a call share. Nothing else in the project encodes tensors.
"""

import os

# grpc's EventEngine (its default for clients and listeners) hands each message between its
# own threads before the asyncio poller sees it: a stream message cost a service 7.2
# voluntary context switches and 265-298 us of CPU, against 4.1 and 188-258 us with grpc's
# older polling (bench/README.md, 2026-11-27); over the mesh, `digits` at c=32 ran +8.6%
# (median of 8 interleaved rounds) and its c=1 p50 fell 6%. grpc reads this once, when it
# is first imported, so this package is imported before grpc by every process of the mesh
# (proxy/, v2server/ and batch/__init__.py). A deployment's own GRPC_EXPERIMENTS wins.
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)

from protos import grpc_predict_v2_pb2 as pb  # noqa: E402 (after the setting, as grpc must be)
from protos import grpc_predict_v2_pb2_grpc as pb_grpc  # noqa: E402

__all__ = ["pb", "pb_grpc"]
