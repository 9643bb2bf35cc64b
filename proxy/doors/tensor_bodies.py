"""/v1 bodies of pipelines that take tensors (`inputs:` in the definition), read into arrays.

- JSON: an object, input name -> the tensor as nested lists (`{"features": [[0, 3, ...]]}`);
  BYTES elements are strings (UTF-8).
- multipart/form-data: a field per input; for a BYTES input a file (its bytes) or text (one
  element, shape [1]); for any other, the tensor as JSON text.

Every problem is a 400 naming the input: an unknown or missing name, elements of the wrong
kind, a ragged list, an integer out of the datatype's range. Shapes are checked against the
declaration by the engine (Ticket.run_tensors).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import orjson
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from protos.codec import dtype_of
from proxy.engine.tensors import InputTensor
from proxy.errors import Problem

_KINDS = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers"}


def from_json(raw: bytes, declared: Mapping[str, InputTensor]) -> dict[str, np.ndarray]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Problem(400, f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Problem(400, f"body must be a JSON object of the inputs ({_names(declared)})")
    return _tensors(body, declared)


async def from_form(
    request: Request, raw: bytes, declared: Mapping[str, InputTensor], max_bytes: int
) -> dict[str, np.ndarray]:
    async def once() -> AsyncIterator[bytes]:
        yield raw

    parser = MultiPartParser(
        request.headers,
        once(),
        max_files=len(declared),
        max_fields=len(declared) + 10,
        max_part_size=max_bytes,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise Problem(400, f"unreadable multipart body: {exc.message}") from None
    try:
        values: dict[str, Any] = {}
        for name, field in form.multi_items():
            content = await field.read() if isinstance(field, UploadFile) else field
            spec = declared.get(name)
            if spec is not None and spec.datatype == "BYTES":
                values[name] = [content if isinstance(content, bytes) else content.encode()]
            else:
                values[name] = _json_field(name, content)
    finally:
        await form.close()
    return _tensors(values, declared)


def _json_field(name: str, content: str | bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        raise Problem(400, f"field '{name}' must hold the tensor as JSON") from None


def _names(declared: Mapping[str, InputTensor]) -> str:
    return ", ".join(declared)


def _tensors(body: Mapping[str, Any], declared: Mapping[str, InputTensor]) -> dict[str, np.ndarray]:
    unknown = sorted(set(body) - set(declared))
    if unknown:
        raise Problem(400, f"no input named {', '.join(unknown)} (inputs: {_names(declared)})")
    missing = [n for n in declared if n not in body]
    if missing:
        raise Problem(400, f"missing input {', '.join(missing)} (inputs: {_names(declared)})")
    return {name: tensor(name, body[name], spec) for name, spec in declared.items()}


def tensor(name: str, value: Any, spec: InputTensor) -> np.ndarray:
    """One input's array, of its declared datatype."""
    where = f"input '{name}'"
    try:
        array = np.array(value, dtype=object if spec.datatype == "BYTES" else None)
    except ValueError:
        raise Problem(400, f"{where}: a ragged list (rows of different lengths)") from None
    if spec.datatype == "BYTES":
        flat = array.reshape(-1)
        for i, element in enumerate(flat):
            if isinstance(element, str):
                flat[i] = element.encode()
            elif not isinstance(element, bytes):
                raise Problem(400, f"{where}: BYTES elements must be strings")
        return flat.reshape(array.shape)
    dtype = dtype_of(spec.datatype, name)
    wanted = _KINDS[dtype.kind]
    if array.dtype.kind not in _KINDS or (array.size and not _fits(array.dtype.kind, dtype.kind)):
        raise Problem(400, f"{where}: {spec.datatype} elements must be JSON {wanted}")
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise Problem(400, f"{where}: an element is out of {spec.datatype}'s range")
    with np.errstate(over="ignore"):
        cast = array.astype(dtype)
    # JSON has no infinity: one here is a number too large for the type (1e39 as FP32),
    # which the models would turn into NaN and the mesh refuse as its own fault (502).
    if dtype.kind == "f" and cast.size and not np.isfinite(cast).all():
        raise Problem(400, f"{where}: an element is out of {spec.datatype}'s range")
    return cast


def _fits(given: str, wanted: str) -> bool:
    """JSON booleans only for BOOL; integers for integer types; any number for floats."""
    if wanted == "b":
        return given == "b"
    if wanted in "iu":
        return given in "iu"
    return given in "iuf"
