"""The preprocess service: OpenCV recipes served as v2 models."""

import os

# OpenCV reads its decoders' limits once, when it is first imported: they must be set
# before any `import cv2` (this package is imported first). A backstop only: uploads are
# checked from their headers before OpenCV sees them (preprocess/images.py).
os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(40_000_000))
os.environ.setdefault("OPENCV_IO_ENABLE_OPENEXR", "0")
os.environ.setdefault("OPENCV_IO_ENABLE_JASPER", "0")
