"""The predictor service: ONNX Runtime models over the v2 gRPC protocol."""

__version__ = "0.1.0"
