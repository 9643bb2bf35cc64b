"""The answers on a ModelStreamInfer stream, read without copying their tensors: each one
names its request by id and carries its own status (our services put the code beside
`error_message`, v2server/servicer.py; another server's error counts as UNKNOWN)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from protos import pb, wire
from protos.channels import HTTP_STATUS_PARAMETER, STREAM_STATUS_PARAMETER
from protos.errors import InvalidInput
from proxy.transport.failures import CallFailed


@dataclass(frozen=True)
class StreamAnswer:
    id: str
    response: wire.ParsedInferResponse | None
    failure: CallFailed | None = None


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def parse_stream_response(data: bytes) -> StreamAnswer:
    """gRPC deserializer for ModelStreamInferResponse; the answer's tensors stay in the
    received buffer. Never raises (a bad message fails its request, not the stream)."""
    try:
        if len(data) <= wire.PARSE_WHOLE_UP_TO:
            whole = pb.ModelStreamInferResponse.FromString(data)
            error = whole.error_message
            parsed = wire.whole_infer_response(whole.infer_response)
        else:
            head, inner = wire.split_field(data, wire.STREAM_RESPONSE_FIELD)
            error = pb.ModelStreamInferResponse.FromString(head).error_message
            parsed = wire.parse_infer_response(inner[0] if inner else b"")
    except (InvalidInput, DecodeError) as exc:
        failure = CallFailed(grpc.StatusCode.INTERNAL, f"malformed stream answer: {exc}")
        return StreamAnswer("", None, failure)
    if not error:
        return StreamAnswer(parsed.message.id, parsed)
    parameters = parsed.message.parameters
    param, http = parameters.get(STREAM_STATUS_PARAMETER), parameters.get(HTTP_STATUS_PARAMETER)
    code = _CODES.get(param.int64_param if param is not None else -1, grpc.StatusCode.UNKNOWN)
    failure = CallFailed(code, error, http_status=http.int64_param if http is not None else None)
    return StreamAnswer(parsed.message.id, None, failure)
