"""The preprocess service: OpenCV recipes served as v2 models."""

__version__ = "0.1.0"
