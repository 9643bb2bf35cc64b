"""The proxy: the REST front door that runs pipelines over v2 gRPC services."""
