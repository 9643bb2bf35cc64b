"""Whether a call's model takes what its pipeline sends it, from the services' metadata;
and a model its endpoint does not serve told as the mesh's failure, not the client's 404.

A predictor swapped for one with other inputs (an endpoint variable re-pointed, a new model
version) refuses every call with INVALID_ARGUMENT, which the proxy would pass on as the
client's 400: yet no request could fix it. When a call is refused so, the metadata of its
model and of the models that produced its inputs say whether the pipeline's wiring is the
cause; if it is, the call fails as the mesh's own configuration error (INTERNAL: 502),
naming both sides, as Triton refuses to load an ensemble whose models do not fit.
Only asked on that error path (a correct call costs nothing), each model's metadata from the
proxy's one catalog of them (transport/catalog.py: asked at most once per check_s)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from protos import pb
from proxy.engine.canaries import answered_by
from proxy.engine.definitions import CallingStep
from proxy.engine.plan import Plan
from proxy.engine.run import Run
from proxy.errors import StepError
from proxy.transport.catalog import Catalog
from proxy.transport.target import Target

Declared = tuple[str, tuple[int, ...]]
"""A tensor's datatype and shape (-1: any size)."""
IMAGE: Declared = ("BYTES", (-1,))
"""What a pipeline sends for its uploaded image (one element a request; merged calls more)."""


def fits(sent: Declared, taken: Declared) -> bool:
    """Whether a tensor declared `sent` always fits an input declared `taken`."""
    (sent_type, sent_shape), (taken_type, taken_shape) = sent, taken
    return (
        sent_type == taken_type
        and len(sent_shape) == len(taken_shape)
        and all(a == b or a < 0 or b < 0 for a, b in zip(sent_shape, taken_shape, strict=True))
    )


def _named(tensor: pb.ModelMetadataResponse.TensorMetadata) -> str:
    return f"'{tensor.name}' {tensor.datatype} {list(tensor.shape)}"


def mismatch(
    target: Target,
    taken: Sequence[pb.ModelMetadataResponse.TensorMetadata],
    sent: dict[str, tuple[str, Declared | None]],
) -> str | None:
    """Why `target`'s model, declaring inputs `taken`, cannot take `sent` (input name ->
    (reference, what the reference is declared as, if known)); None when it can."""
    by_name = {t.name: t for t in taken}
    model = f"model '{target.model}' at {target.address}"
    for name, (ref, declared) in sent.items():
        spec = by_name.get(name)
        if spec is None:
            inputs = ", ".join(_named(t) for t in taken)
            return f"{model} has no input '{name}' (it takes {inputs}); the pipeline sends {ref}"
        if declared is not None and not fits(declared, (spec.datatype, tuple(spec.shape))):
            return (
                f"{model} takes {_named(spec)}; the pipeline sends {ref} as "
                f"{declared[0]} {list(declared[1])}"
            )
    return None


def no_output(
    label: str, target: Target, meta: pb.ModelMetadataResponse | None, tensor: str
) -> str | None:
    """Why the pipeline's read of `tensor` from call `label` (a step, or `<parallel
    step>/<branch>`) cannot be filled: its model declares no such output. None when it does,
    or when the metadata says nothing."""
    declared = [o.name for o in meta.outputs] if meta is not None else []
    if not declared or tensor in declared:
        return None
    read = f"'{label}.{tensor}'" if "/" not in label else f"'{tensor}' of {label}"
    return (
        f"the pipeline reads {read}, but model '{target.model}' at {target.address} has no "
        f"output '{tensor}' (it has {', '.join(declared)})"
    )


class Wiring:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def explained(
        self,
        exc: StepError,
        plan: Plan,
        step: CallingStep,
        deadline: float,
        target: Target | None = None,
    ) -> StepError:
        """`exc` of the call `exc.step` (made to `target`, else the step's own) as the
        configuration error it is, when the wiring explains its INVALID_ARGUMENT; else `exc`
        itself (also when the metadata does not come before the request's `deadline`, loop
        time). A model its endpoint does not serve is UNAVAILABLE (503), not the client's 404."""
        target = plan.targets.get(exc.step) if target is None else target
        if exc.code == grpc.StatusCode.NOT_FOUND and target is not None:
            # Unloaded (model control), not loaded yet, or the variable re-pointed: the
            # pipeline exists and cannot run now, as Triton answers an ensemble whose
            # composing model is not ready. Counted as the step's failure, not a client's.
            return StepError(
                exc.step,
                grpc.StatusCode.UNAVAILABLE,
                f"model '{target.model}' is not served at {target.address}: {exc.message}",
            )
        if exc.code != grpc.StatusCode.INVALID_ARGUMENT or target is None:
            return exc
        try:
            async with asyncio.timeout_at(deadline):
                why = await self.why_not(plan, step, target)
        except TimeoutError:
            return exc
        if why is None:
            return exc
        return StepError(exc.step, grpc.StatusCode.INTERNAL, f"pipeline misconfigured: {why}")

    async def why_not(self, plan: Plan, step: CallingStep, target: Target) -> str | None:
        """Why `target`'s model cannot take what `step` sends it, from its metadata; None
        when it can, or when nothing says."""
        meta = await self.metadata(target)
        if meta is None or not meta.inputs:  # it cannot say: the service judged the call
            return None
        sent = {name: (ref, await self._declared(plan, ref)) for name, ref in step.inputs.items()}
        return mismatch(target, meta.inputs, sent)

    async def undeclared(
        self, run: Run, missing: Sequence[tuple[str, str]], reader: str = ""
    ) -> StepError | None:
        """The pipeline's configuration error when a tensor read and not found is one the
        call's model does not have (its metadata declares no such output): a typo in the
        definition, or a model swapped for one with other outputs. `missing`: (call label,
        tensor) pairs of calls that answered (a step, or `<parallel step>/<branch>`). None
        when nothing says so: the output is declared (an optional one not sent), or the
        metadata does not come before the request's deadline. `reader`: the step whose
        input it is (the error's step; else the call's own, for the result)."""
        for label, tensor in missing:
            target = _answered_by(run, label)
            if target is None:
                continue
            try:
                async with asyncio.timeout_at(run.deadline):
                    meta = await self.metadata(target)
            except TimeoutError:
                return None
            why = no_output(label, target, meta, tensor)
            if why is not None:
                return StepError(
                    reader or label, grpc.StatusCode.INTERNAL, f"pipeline misconfigured: {why}"
                )
        return None

    async def metadata(self, target: Target) -> pb.ModelMetadataResponse | None:
        described = await self.catalog.of(target.address, target.model, target.version)
        return None if described is None else described.meta

    async def _declared(self, plan: Plan, ref: str) -> Declared | None:
        """What `ref` is declared as: the request's image or tensor, or a call step's output
        in its model's metadata; None when nothing says (a parallel step's combination)."""
        producer, _, tensor = ref.partition(".")
        if producer == "request":
            inputs = plan.pipeline.inputs
            if inputs is None:
                return IMAGE
            spec = inputs[tensor]
            return spec.datatype, tuple(spec.shape)
        target = plan.targets.get(producer)
        meta = None if target is None else await self.metadata(target)
        for output in () if meta is None else meta.outputs:
            if output.name == tensor:
                return output.datatype, tuple(output.shape)
        return None


def _answered_by(run: Run, label: str) -> Target | None:
    """The target whose answer call `label` gave, by the variant its status names."""
    canary = any(s.name == label and s.variant == "canary" for s in run.steps)
    return answered_by(run.plan, label, "canary" if canary else None)
