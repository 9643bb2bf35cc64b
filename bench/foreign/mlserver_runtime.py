"""An MLServer custom runtime serving one of our ONNX classifiers with onnxruntime, as a user
would write one to serve their model on MLServer (runs in .venv-mlserver, not the mesh's)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class OnnxClassifier(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        uri = self.settings.parameters.uri
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        values = self._session.run(None, {self._input: x})
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            # The graph's own shapes (NumpyCodec would make the labels [N, 1]).
            outputs=[
                ResponseOutput(
                    name=name,
                    shape=list(value.shape),
                    datatype="INT64" if value.dtype == np.int64 else "FP32",
                    data=value.reshape(-1).tolist(),
                )
                for name, value in zip(self._outputs, values, strict=True)
            ],
        )
