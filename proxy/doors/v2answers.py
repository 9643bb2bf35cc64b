"""v2 REST answers: inference outputs (JSON, or Triton's binary tensor extension), and the data
plane's protobuf answers (metadata, configuration, statistics, repository index) as Triton's
HTTP server writes them: field names as in the .proto, 64-bit integers as JSON numbers, and
every field of a model configuration present (tritonclient and perf_analyzer read
`max_batch_size` even when it is 0)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from protos import codec
from proxy.engine.results import to_json

_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def message(answer: Message, *, defaults: bool = False) -> dict[str, Any]:
    """`answer` as Triton's JSON; `defaults`: fields at their default value written too."""
    body = MessageToDict(
        answer, preserving_proto_field_name=True, always_print_fields_with_no_presence=defaults
    )
    _numbers(answer.DESCRIPTOR, body)
    return body


def _numbers(descriptor: Descriptor, body: dict[str, Any]) -> None:
    """64-bit integers back to numbers (protobuf's JSON writes them as strings)."""
    for field in descriptor.fields:
        if field.name not in body:
            continue
        value = body[field.name]
        kind = field.message_type
        repeated = field.is_repeated
        if field.type in _INT64:
            body[field.name] = [int(v) for v in value] if repeated else int(value)
        elif kind is not None and kind.GetOptions().map_entry:
            inner = kind.fields_by_name["value"]
            for key, item in value.items():
                if inner.type in _INT64:
                    value[key] = int(item)
                elif inner.message_type is not None:
                    _numbers(inner.message_type, item)
        elif kind is not None:
            for item in value if repeated else [value]:
                _numbers(kind, item)


def answer(
    model: str,
    version: str,
    request_id: str,
    outputs: dict[str, np.ndarray],
    binary: set[str] | None,
    parameters: dict[str, str | int | bool] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The v2 REST answer and its headers; the outputs in `binary` (None: all) as raw
    bytes after the JSON header (BYTES elements length-prefixed, as on gRPC)."""
    described, chunks = [], []
    for name, array in outputs.items():
        entry: dict[str, Any] = {
            "name": name,
            "datatype": codec.datatype_of(array),
            "shape": list(array.shape),
        }
        if binary is None or name in binary:
            raw = bytes(codec.to_raw_view(array)[1])
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = to_json(array.reshape(-1))
        described.append(entry)
    head: dict[str, Any] = {"model_name": model, "model_version": version, "id": request_id}
    if parameters:
        head["parameters"] = parameters
    head["outputs"] = described
    header = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(chunks), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
