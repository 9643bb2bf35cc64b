"""`./mesh batch PIPELINE SOURCE -o SINK`: a pipeline run over a folder, a glob or a manifest
of inputs through the running mesh's doors, resumable, with progress (docs/batch.md)."""

import protos  # noqa: F401  (first: it sets grpc's environment before grpc loads)
