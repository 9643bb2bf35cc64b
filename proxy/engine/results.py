"""Shape a pipeline's answer from its tensors, as the definition's `result` template says.

- "step.tensor" or "step.tensor[i]": the tensor (or its i-th row) as JSON
- {zip: {field: ref, ...}}: a list of records over the tensors' first dimension; a field
  may also be {group: {field: ref, ...}, by: ref}: each record's own list of records, those
  rows of the group's tensors whose `by` (an integer per row) is the record's index (OCR's
  words, by the line they are on)
- {per_branch: step, fields: {field: "tensor[i]"}}: a record per successful branch
Missing tensors (a step a switch skipped) give null, or [] in a zip.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

REFERENCE = re.compile(r"^(?P<step>[A-Za-z0-9_\-]+)\.(?P<tensor>.+?)(?:\[(?P<index>-?\d+)\])?$")


def to_json(value: Any) -> Any:
    """Tensors (and their elements) as JSON values; BYTES become UTF-8 text."""
    if isinstance(value, np.ndarray):
        if value.dtype == object or value.dtype.kind == "S":  # a row of BYTES: numpy bytes
            return [to_json(v) for v in value] if value.ndim else to_json(value.item())
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


Tensors = dict[str, np.ndarray]
Branches = dict[str, dict[str, Tensors]]
Renderer = Callable[[Tensors, Branches], Any]
Getter = Callable[[Mapping[str, np.ndarray]], "np.ndarray | None"]


def render(template: Any, tensors: Tensors, branches: Branches) -> Any:
    """The answer `template` gives over these tensors (compile it once to render it often)."""
    return compiled(template)(tensors, branches)


def compiled(template: Any) -> Renderer:
    """The template parsed once, as a function of the tensors: every reference matched and
    split, every kind of part decided, before the first request (parsing it on every answer
    was a tenth of a cache hit's cost)."""
    if isinstance(template, str):
        value = _value(template)
        return lambda tensors, branches: value(tensors)
    if isinstance(template, list):
        parts = [compiled(t) for t in template]
        return lambda tensors, branches: [part(tensors, branches) for part in parts]
    if not isinstance(template, dict):
        return lambda tensors, branches: template
    if set(template) == {"zip"}:
        return _zip(template["zip"])
    if set(template) == {"per_branch", "fields"}:
        return _per_branch(template["per_branch"], template["fields"])
    items = [(k, compiled(v)) for k, v in template.items()]
    return lambda tensors, branches: {k: part(tensors, branches) for k, part in items}


def _getter(ref: str, scoped: bool = False) -> Getter:
    """What `ref` ("step.tensor" or "step.tensor[i]") reads: the tensor or its i-th row, None
    when missing. `scoped`: read from one branch's outputs, keyed by the tensor alone."""
    match = REFERENCE.match(ref)
    if not match:
        return lambda tensors: None
    key = match["tensor"] if scoped else f"{match['step']}.{match['tensor']}"
    if match["index"] is None:

        def whole(tensors: Mapping[str, np.ndarray]) -> np.ndarray | None:
            value = tensors.get(key)
            return None if value is None else np.asarray(value)

        return whole
    i = int(match["index"])

    def row(tensors: Mapping[str, np.ndarray]) -> np.ndarray | None:
        value = tensors.get(key)
        if value is None or value.ndim == 0 or not -len(value) <= i < len(value):
            return None
        return np.asarray(value[i])

    return row


def _value(ref: str, scoped: bool = False) -> Callable[[Mapping[str, np.ndarray]], Any]:
    """What `ref` reads (`_getter`), as JSON; None when missing."""
    get = _getter(ref, scoped)

    def value(tensors: Mapping[str, np.ndarray]) -> Any:
        found = get(tensors)
        return None if found is None else to_json(found)

    return value


def _zip(fields: dict[str, Any]) -> Renderer:
    getters = {k: _getter(ref) for k, ref in fields.items() if isinstance(ref, str)}
    groups = {k: _group(g) for k, g in fields.items() if isinstance(g, dict)}

    def zipped(tensors: Tensors, branches: Branches) -> list[dict[str, Any]]:
        columns = {k: get(tensors) for k, get in getters.items()}
        if not columns or any(c is None for c in columns.values()):
            return []
        rows = min(len(c) for c in columns.values() if c is not None)
        records = [
            {k: to_json(c[i]) for k, c in columns.items() if c is not None} for i in range(rows)
        ]
        for k, grouped in groups.items():
            for record, members in zip(records, grouped(tensors, rows), strict=True):
                record[k] = members
        return records

    return zipped


def _per_branch(step: str, fields: dict[str, str]) -> Renderer:
    values = {k: _value(f"b.{ref}", scoped=True) for k, ref in fields.items()}

    def per_branch(tensors: Tensors, branches: Branches) -> dict[str, Any]:
        return {
            branch: {k: value(outputs) for k, value in values.items()}
            for branch, outputs in branches.get(step, {}).items()
        }

    return per_branch


def _group(template: dict) -> Callable[[Tensors, int], list[list[dict]]]:
    """{group: {field: ref}, by: ref}: the group's records dealt out to `rows` lists by the
    row index `by` gives each (one out of range belongs to none)."""
    by = _getter(str(template.get("by")))
    members = _zip(template.get("group", {}))

    def grouped(tensors: Tensors, rows: int) -> list[list[dict]]:
        out: list[list[dict]] = [[] for _ in range(rows)]
        index = by(tensors)
        records = members(tensors, {})
        if index is None:
            return out
        for row, member in zip(index.reshape(-1).tolist(), records, strict=False):
            if 0 <= row < rows:
                out[row].append(member)
        return out

    return grouped
