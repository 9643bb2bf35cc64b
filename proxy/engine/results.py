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
from typing import Any

import numpy as np

_REF = re.compile(r"^(?P<step>[A-Za-z0-9_\-]+)\.(?P<tensor>.+?)(?:\[(?P<index>-?\d+)\])?$")


def to_json(value: Any) -> Any:
    """Tensors (and their elements) as JSON values; BYTES become UTF-8 text."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return [to_json(v) for v in value] if value.ndim else to_json(value.item())
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _lookup(ref: str, tensors: dict[str, np.ndarray]) -> np.ndarray | None:
    match = _REF.match(ref)
    if not match:
        return None
    value = tensors.get(f"{match['step']}.{match['tensor']}")
    if value is None:
        return None
    if match["index"] is not None:
        i = int(match["index"])
        if value.ndim == 0 or not -len(value) <= i < len(value):
            return None
        value = value[i]
    return np.asarray(value)


def render(
    template: Any,
    tensors: dict[str, np.ndarray],
    branches: dict[str, dict[str, dict[str, np.ndarray]]],
) -> Any:
    if isinstance(template, str):
        value = _lookup(template, tensors)
        return None if value is None else to_json(value)
    if isinstance(template, list):
        return [render(t, tensors, branches) for t in template]
    if not isinstance(template, dict):
        return template
    if set(template) == {"zip"}:
        fields = template["zip"]
        columns = {k: _lookup(ref, tensors) for k, ref in fields.items() if isinstance(ref, str)}
        if not columns or any(c is None for c in columns.values()):
            return []
        rows = min(len(c) for c in columns.values() if c is not None)
        records = [
            {k: to_json(c[i]) for k, c in columns.items() if c is not None} for i in range(rows)
        ]
        for k, grouped in fields.items():
            if isinstance(grouped, dict):
                for record, members in zip(records, _grouped(grouped, tensors, rows), strict=True):
                    record[k] = members
        return records
    if set(template) == {"per_branch", "fields"}:
        out = {}
        for branch, outputs in branches.get(template["per_branch"], {}).items():
            scoped = {f"b.{name}": value for name, value in outputs.items()}
            out[branch] = {
                k: render(f"b.{ref}", scoped, {}) for k, ref in template["fields"].items()
            }
        return out
    return {k: render(v, tensors, branches) for k, v in template.items()}


def _grouped(template: dict, tensors: dict[str, np.ndarray], rows: int) -> list[list[dict]]:
    """{group: {field: ref}, by: ref}: the group's records dealt out to `rows` lists by the
    row index `by` gives each (one out of range belongs to none)."""
    out: list[list[dict]] = [[] for _ in range(rows)]
    by = _lookup(str(template.get("by")), tensors)
    members = render({"zip": template.get("group", {})}, tensors, {})
    if by is None:
        return out
    for row, member in zip(by.reshape(-1).tolist(), members, strict=False):
        if 0 <= row < rows:
            out[row].append(member)
    return out
