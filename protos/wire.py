"""Protobuf wire-format shortcuts that keep tensor bytes out of protobuf copies.

A 600 KB image tensor costs ~0.3 ms per copy on a small VM, and the generic
path copies it four times per hop (parse, field access, tobytes, serialize).
Here the raw tensor fields of ModelInferRequest / ModelInferResponse are split
off as memoryviews of the received buffer, and written by one join when
sending; protobuf only ever sees the small remainder.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError, Message

from protos import pb
from protos.errors import InvalidInput

INPUTS_FIELD = 5  # ModelInferRequest.inputs
CONTENTS_FIELD = 5  # ModelInferRequest.InferInputTensor.contents
RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
SPLIT_CONTENTS_ABOVE = 64 * 1024
"""Requests whose non-raw part is larger have their inputs' typed contents split off."""
RAW_OUTPUT_FIELD = 6  # ModelInferResponse.raw_output_contents
_LENGTH_DELIMITED = 2
PARSE_WHOLE_UP_TO = 8 * 1024
"""Messages this small are parsed whole by protobuf, their tensors copied out (a few us at
most): splitting a 200-byte `digits` answer in Python took 12.6 us, protobuf's parse 2.4 us,
and every call on every hop has a message like it."""


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    if pos < len(view) and view[pos] < 0x80:  # one byte: every tag and most lengths here
        return view[pos], pos + 1
    result = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise InvalidInput("malformed protobuf message: truncated varint")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def split_field(data: bytes | memoryview, field: int) -> tuple[bytes, list[memoryview]]:
    """(the message without `field`, the `field` values as views into `data`)."""
    view = memoryview(data)
    size = len(view)
    rest: list[memoryview] = []
    values: list[memoryview] = []
    pos = 0
    while pos < size:
        start = pos
        tag, pos = _varint(view, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, end = _varint(view, pos)
        elif wire_type == 1:
            end = pos + 8
        elif wire_type == _LENGTH_DELIMITED:
            length, pos = _varint(view, pos)
            end = pos + length
        elif wire_type == 5:
            end = pos + 4
        else:
            raise InvalidInput(f"malformed protobuf message: wire type {wire_type}")
        if end > size:
            raise InvalidInput("malformed protobuf message: field runs past the end")
        if number == field and wire_type == _LENGTH_DELIMITED:
            values.append(view[pos:end])
        else:
            rest.append(view[start:end])
        pos = end
    return b"".join(rest), values


def with_field(head: Message, field: int, values: Sequence[bytes | memoryview]) -> bytes:
    """`head` serialized, followed by `values` as repeated bytes `field`: one copy each."""
    tag = encode_varint((field << 3) | _LENGTH_DELIMITED)
    parts: list[bytes | memoryview] = [head.SerializeToString()]
    for value in values:
        parts += [
            tag,
            encode_varint(len(value) if isinstance(value, bytes) else value.nbytes),
            value,
        ]
    return b"".join(parts)


class ParsedInferRequest:
    """A ModelInferRequest whose raw_input_contents stayed in the received buffer."""

    __slots__ = ("contents", "error", "message", "raw", "size")

    def __init__(
        self,
        message: pb.ModelInferRequest,
        raw: Sequence[memoryview | bytes],
        error: str = "",
        size: int = 0,
        contents: Sequence[memoryview | bytes | None] = (),
    ) -> None:
        self.message = message
        self.raw = raw
        self.contents = contents
        """Each input's typed contents, still serialized (None: it has none): parsed only
        once its declared shape is accepted, as 5 M empty BYTES elements cost protobuf
        ~200 MB to parse (their inputs' `contents` in `message` are left empty)."""
        self.error = error
        self.size = size
        """Bytes of the message as received."""
        """Set when the bytes did not parse; the handler reports it as INVALID_ARGUMENT."""

    def release(self) -> None:
        """Its tensors' bytes let go once it is answered: a grpc.aio server's stream reader
        holds the last message it read until the next arrives."""
        self.raw = self.contents = ()

    # The interceptor and logs read these like on a plain message.
    @property
    def model_name(self) -> str:
        return self.message.model_name

    @property
    def id(self) -> str:
        return self.message.id


def parse_infer_request(data: bytes) -> ParsedInferRequest:
    """gRPC request deserializer for ModelInfer; never raises (gRPC would answer UNKNOWN)."""
    try:
        if len(data) <= PARSE_WHOLE_UP_TO:
            message = pb.ModelInferRequest.FromString(data)
            whole = message.raw_input_contents[:]  # a list, without iterating (codec.checked_shape)
            message.ClearField("raw_input_contents")
            return ParsedInferRequest(message, whole, size=len(data))
        head, raw = split_field(data, RAW_INPUT_FIELD)
        # A small remainder cannot hold costly typed contents: parsed as it is (the split
        # costs ~3 us a request).
        contents = _split_contents(head) if len(head) > SPLIT_CONTENTS_ABOVE else None
        if contents is not None:
            head, contents = contents
        message = pb.ModelInferRequest.FromString(head)
        return ParsedInferRequest(message, raw, size=len(data), contents=contents or ())
    except (InvalidInput, DecodeError) as exc:
        message = str(exc) or "malformed"
        return ParsedInferRequest(pb.ModelInferRequest(), [], error=message, size=len(data))


def _split_contents(head: bytes) -> tuple[bytes, list[memoryview | bytes | None]]:
    """(the request without its inputs' typed contents, each input's contents or None)."""
    rest, inputs = split_field(head, INPUTS_FIELD)
    split = [split_field(entry, CONTENTS_FIELD) for entry in inputs]
    contents: list[memoryview | bytes | None] = [
        None if not found else found[0] if len(found) == 1 else b"".join(found)
        for _, found in split
    ]
    if all(c is None for c in contents):
        return head, contents
    tag = encode_varint((INPUTS_FIELD << 3) | _LENGTH_DELIMITED)
    entries = [tag + encode_varint(len(inner)) + inner for inner, _ in split]
    return rest + b"".join(entries), contents


def serialize_infer_request(request: pb.ModelInferRequest | ParsedInferRequest | bytes) -> bytes:
    """gRPC request serializer accepting a message, a parsed request or ready bytes."""
    if isinstance(request, bytes):
        return request
    if isinstance(request, ParsedInferRequest):
        return with_field(request.message, RAW_INPUT_FIELD, request.raw)
    return request.SerializeToString()


class Handed:
    """A serialized message handed to gRPC once. Its serializer takes the bytes out: a
    grpc.aio server's stream writer holds the last message it sent until the next, so every
    idle stream kept its last answer (an OCR page's tensors are up to 20 MiB)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def serialize_response(response: Message | bytes | Handed) -> bytes:
    """gRPC response serializer: ready bytes pass through untouched."""
    if isinstance(response, Handed):
        data, response.data = response.data, b""
        return data
    return response if isinstance(response, bytes) else response.SerializeToString()


STREAM_RESPONSE_FIELD = 2  # ModelStreamInferResponse.infer_response


def stream_response(infer_response: bytes) -> bytes:
    """A ModelStreamInferResponse around an already serialized ModelInferResponse."""
    tag = encode_varint((STREAM_RESPONSE_FIELD << 3) | _LENGTH_DELIMITED)
    return b"".join((tag, encode_varint(len(infer_response)), infer_response))


class ParsedInferResponse:
    """A ModelInferResponse whose raw_output_contents stayed in the received buffer."""

    __slots__ = ("message", "raw")

    def __init__(self, message: pb.ModelInferResponse, raw: Sequence[memoryview | bytes]) -> None:
        self.message = message
        self.raw = raw


def parse_infer_response(data: bytes | memoryview) -> ParsedInferResponse:
    if len(data) <= PARSE_WHOLE_UP_TO:
        return whole_infer_response(pb.ModelInferResponse.FromString(data))
    head, raw = split_field(data, RAW_OUTPUT_FIELD)
    return ParsedInferResponse(pb.ModelInferResponse.FromString(head), raw)


def whole_infer_response(message: pb.ModelInferResponse) -> ParsedInferResponse:
    """A response parsed whole, its raw contents taken out as they would have been split."""
    raw = message.raw_output_contents[:]  # a list, without iterating (codec.checked_shape)
    message.ClearField("raw_output_contents")
    return ParsedInferResponse(message, raw)
