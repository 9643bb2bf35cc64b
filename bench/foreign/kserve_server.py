"""KServe's Python model server serving one of our ONNX classifiers with onnxruntime, as a
user would write one (runs in .venv-kserve-server, not the mesh's).
Usage: python kserve_server.py MODEL_NAME ONNX_FILE GRPC_PORT HTTP_PORT
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxClassifier(Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.path = path

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.ready = True
        return True

    def get_input_types(self) -> list[dict]:
        return [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]

    def get_output_types(self) -> list[dict]:
        return [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        ]

    def predict(self, payload: InferRequest, headers: dict | None = None) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float32)
        values = self.session.run(None, {self.session.get_inputs()[0].name: x})
        outputs = []
        for meta, value in zip(self.session.get_outputs(), values, strict=True):
            datatype = "INT64" if value.dtype == np.int64 else "FP32"
            output = InferOutput(meta.name, list(value.shape), datatype)
            output.set_data_from_numpy(value, binary_data=False)
            outputs.append(output)
        return InferResponse(
            model_name=self.name,
            infer_outputs=outputs,
            response_id=payload.id,
            use_binary_outputs=False,
        )


if __name__ == "__main__":
    name, path, grpc_port, http_port = sys.argv[1:5]
    model = OnnxClassifier(name, path)
    model.load()
    ModelServer(grpc_port=int(grpc_port), http_port=int(http_port), workers=1).start([model])
