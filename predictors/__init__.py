"""The predictor service: ONNX Runtime models over the v2 gRPC protocol."""
