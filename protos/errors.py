"""The mesh's error hierarchy: every error carries the gRPC status it maps to.

Services raise these; one interceptor (v2server.interceptors) turns them into
gRPC statuses, and the proxy turns gRPC statuses into HTTP ones through one
table. Anything else that escapes a handler is reported as a bare INTERNAL
error, never with its text.
"""

from __future__ import annotations

import grpc

MAX_MESSAGE = 1000
"""Characters of an error message shown to a caller. Messages name what the caller sent
(unknown input names, a field's value), and a body may hold 200,000 names: its 400 answer
repeated them all (1.8 MB for a 3.2 MB body), and they went on into logs and gRPC trailers."""


def capped(message: str, most: int = MAX_MESSAGE) -> str:
    """`message`, cut to `most` characters with a note of how much was left out."""
    if len(message) <= most:
        return message
    return f"{message[:most]}... ({len(message) - most:,} more characters)"


class MeshError(Exception):
    """Base class: an error whose message is safe and useful to show a caller."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        message = capped(message)
        super().__init__(message)
        self.message = message


class InvalidInput(MeshError):
    """The request is malformed: wrong tensor name, datatype, shape, bytes or image."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MeshError):
    """Unknown model, version or recipe."""

    code = grpc.StatusCode.NOT_FOUND


class Overloaded(MeshError):
    """A bounded queue is full; the caller should retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(MeshError):
    """The caller's deadline passed before the work could be done."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(MeshError):
    """The service (or a model in it) cannot serve right now, e.g. shutting down."""

    code = grpc.StatusCode.UNAVAILABLE


class AlreadyExists(MeshError):
    """A name the caller wants to register is taken (e.g. a shared memory region)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Unsupported(MeshError):
    """The server does not offer what was asked (e.g. an extension turned off)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Downstream(MeshError):
    """An error another server answered, passed on with its own status and message (the
    proxy forwarding a call to the service that hosts the model)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def few(items: list[str], most: int = 20) -> str:
    """`items` for a message: the first `most`, then how many more (a repository pointed at
    a crowded folder listed hundreds of names in one log line)."""
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")
