"""The proxy: the REST front door that runs pipelines over v2 gRPC services."""

import protos  # noqa: F401  (first: it sets grpc's environment before grpc loads)
