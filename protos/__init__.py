"""The wire schema of the mesh: the Open Inference Protocol v2 over gRPC.

`pb` holds the messages, `pb_grpc` the service stubs, `codec` the one numpy <-> v2
tensor codec and `messages` whole requests and answers; `wire` splices tensor bytes into
messages without copies; `channels`, `tls`, `errors`, `logs`, `media` are what both sides
of a call share. Nothing else in the project encodes tensors.
"""

from protos import grpc_predict_v2_pb2 as pb
from protos import grpc_predict_v2_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
