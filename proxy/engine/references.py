"""What a pipeline's references may name, checked when its plan is made (plan.py): each
names an earlier step or the request and one tensor that step makes, so that a definition
that could never be filled stops the proxy at start instead of answering null."""

from __future__ import annotations

from typing import Any

from proxy.engine.definitions import Combine
from proxy.engine.results import REFERENCE
from proxy.errors import DefinitionError


def check_ref(ref: str, known: set[str], inputs: set[str], where: str) -> None:
    step, _, tensor = ref.partition(".")
    if not tensor:
        raise DefinitionError(f"{where}: reference '{ref}' must be <step>.<tensor>")
    if step == "request":
        if tensor not in inputs:
            raise DefinitionError(f"{where}: the request has no tensor '{tensor}'")
        return
    if step not in known:
        raise DefinitionError(
            f"{where}: reference '{ref}' names no earlier step "
            f"(known: {', '.join(sorted(known)) or 'none'}); steps may only use earlier outputs"
        )


def check_result(template: Any, known: set[str], inputs: set[str], where: str) -> None:
    """Every reference of the result template names a step (or the request) and one tensor,
    with at most one row index: a reference that could never match answered null, silently
    (`step.out[0][0]` read a tensor named `out[0]`)."""
    if isinstance(template, list):
        for item in template:
            check_result(item, known, inputs, where)
    elif isinstance(template, dict):
        for key, value in template.items():
            if key == "per_branch" and isinstance(value, str):
                if value not in known:
                    raise DefinitionError(f"{where}: per_branch '{value}' names no step")
            elif key == "fields" and "per_branch" in template and isinstance(value, dict):
                for field, ref in value.items():  # a branch's own tensors: no step before them
                    check_result(f"b.{ref}", {"b"}, set(), f"{where}, per_branch field '{field}'")
            else:
                check_result(value, known, inputs, f"{where}.{key}")
    elif isinstance(template, str):
        match = REFERENCE.match(template)
        if match is None or "[" in match["tensor"] or "]" in match["tensor"]:
            raise DefinitionError(
                f"{where}: '{template}' is not a reference <step>.<tensor> or "
                "<step>.<tensor>[<row>] (a result holds references to tensors only)"
            )
        check_ref(template, known, inputs, where)


def references(template: Any) -> set[str]:
    """The "step.tensor" references of a result template (row indices dropped; a
    per_branch's fields are its branches' own tensors, not a step's)."""
    if isinstance(template, str):
        match = REFERENCE.match(template)
        return {f"{match['step']}.{match['tensor']}"} if match else set()
    if isinstance(template, list):
        return {r for item in template for r in references(item)}
    if isinstance(template, dict):
        return {
            r
            for key, value in template.items()
            if not (key == "fields" and "per_branch" in template)
            for r in references(value)
        }
    return set()


def branch_reads(template: Any) -> dict[str, set[str]]:
    """Parallel step -> the tensors of its branches' own outputs that the template's
    `per_branch` fields read (row indices dropped)."""
    found: dict[str, set[str]] = {}
    if isinstance(template, list):
        for item in template:
            for step, tensors in branch_reads(item).items():
                found.setdefault(step, set()).update(tensors)
    elif isinstance(template, dict):
        step, fields = template.get("per_branch"), template.get("fields")
        if isinstance(step, str) and isinstance(fields, dict):
            matches = [REFERENCE.match(f"b.{ref}") for ref in fields.values()]
            found[step] = {m["tensor"] for m in matches if m is not None}
        for value in template.values():
            for inner, tensors in branch_reads(value).items():
                found.setdefault(inner, set()).update(tensors)
    return found


def producers(template: Any) -> set[str]:
    """Step names (or "request") a reference or a result template reads from."""
    if isinstance(template, str):
        step, dot, _ = template.partition(".")
        return {step} if dot else set()
    if isinstance(template, list):
        return {p for item in template for p in producers(item)}
    if isinstance(template, dict):
        found = {p for value in template.values() for p in producers(value)}
        if isinstance(template.get("per_branch"), str):
            found.add(template["per_branch"])
        return found
    return set()


def combined(spec: Combine) -> list[str]:
    """The tensors a parallel step makes under its own name (combine.py); its branches'
    outputs are read with `per_branch`."""
    if spec.op == "collect" or spec.tensor is None:
        return []
    if spec.op == "vote":
        return [spec.tensor]
    if spec.op == "argmax":
        return ["label"]
    return sorted({spec.tensor, "label"})


def check_made(
    ref: str, asked: dict[str, list[str]], made: dict[str, list[str]], where: str
) -> None:
    """A read of a tensor its step does not make: one a call step's `outputs` list leaves
    out (`asked`: call step -> that list, empty for all), or one a parallel step's
    combination does not make (`made`)."""
    match = REFERENCE.match(ref)
    if match is None:
        return
    producer, tensor = match["step"], match["tensor"]
    if asked.get(producer) and tensor not in asked[producer]:
        raise DefinitionError(
            f"{where}: reads '{producer}.{tensor}', but step '{producer}' asks its model "
            f"for {', '.join(asked[producer])} only (its `outputs`)"
        )
    if producer in made and tensor not in made[producer]:
        makes = (
            ", ".join(made[producer]) or "no tensor of its own (read its branches' with per_branch)"
        )
        raise DefinitionError(
            f"{where}: reads '{producer}.{tensor}', but parallel step '{producer}' makes {makes}"
        )
