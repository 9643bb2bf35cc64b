"""The gRPC server core shared by every v2 service (predictors, preprocess).

A service supplies a `ModelRepository` (what it serves); this package supplies
the v2 servicer, gRPC health, error mapping, metrics, logs and graceful stop.
"""
