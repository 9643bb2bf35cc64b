"""The gRPC server core shared by every v2 service (predictors, preprocess).

A service supplies `Runnable`s (v2server/model.py: a `run()` and its scheduling); this
package serves them: one registry, batching, statistics, the data plane under a thin v2
servicer, Triton's extensions, gRPC health, error mapping, metrics and graceful stop.
"""

import protos  # noqa: F401  (first: it sets grpc's environment before grpc loads)
