"""The proxy: the REST front door that runs pipelines over v2 gRPC services."""

__version__ = "0.1.0"
