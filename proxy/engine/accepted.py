"""What a pipeline accepts, checked before it runs: an upload's format (415), or the tensors
its `inputs` declare (400 naming the tensor). The engine's and the job door's one check."""

from __future__ import annotations

import numpy as np

from protos import media
from protos.errors import InvalidInput
from proxy.engine.plan import Plan
from proxy.errors import Problem
from v2server.model import TensorSpec
from v2server.validation import check_inputs


def check_format(body: bytes, plan: Plan) -> None:
    """415 unless `body` is an image format the pipeline takes."""
    accepted = plan.pipeline.accept
    if accepted is not None and media.sniff(body) not in accepted:
        raise Problem(
            415,
            f"the upload is {media.describe(body)}; pipeline '{plan.name}' takes "
            + ", ".join(media.ACCEPTED[k] for k in accepted),
        )


def check_tensors(plan: Plan, inputs: dict[str, np.ndarray]) -> None:
    """400 naming the tensor unless `inputs` are the pipeline's declared `inputs`."""
    declared = plan.pipeline.inputs or {}
    specs = [TensorSpec(n, t.datatype, tuple(t.shape)) for n, t in declared.items()]
    try:
        check_inputs(plan.name, specs, inputs)
    except InvalidInput as exc:
        raise Problem(400, str(exc)) from None
