"""What a pipeline accepts, checked before it runs: an upload's format (415), or the tensors
its `inputs` declare (400 naming the tensor). The engine's and the job door's one check."""

from __future__ import annotations

import numpy as np

from protos import media
from protos.errors import InvalidInput
from proxy.engine.plan import Plan
from proxy.engine.tensors import InputTensor
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
    for name, spec in declared.items():
        if spec.bounded:
            _check_bounds(name, spec, inputs[name])


def _check_bounds(name: str, spec: InputTensor, array: np.ndarray) -> None:
    """400 naming the first element outside the input's declared bounds (or NaN)."""
    low = -np.inf if spec.min is None else spec.min
    high = np.inf if spec.max is None else spec.max
    inside = (array >= low) & (array <= high)  # NaN is neither
    if inside.all():
        return
    at = np.unravel_index(int(np.argmin(inside)), array.shape)
    raise Problem(
        400,
        f"input '{name}': elements must lie within [{low:g}, {high:g}]; "
        f"element {[int(i) for i in at]} is {array[at]:g}",
    )
