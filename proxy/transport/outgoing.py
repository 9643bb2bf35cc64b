"""The v2 request a call sends, as bytes: its target, inputs, the outputs asked for, its id,
and on a stream its deadline and trace context (a stream's metadata is the stream's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protos import messages
from proxy.transport.target import Target


@dataclass(frozen=True)
class Asked:
    names: Sequence[str]
    classification: Mapping[str, int] | None


def request_bytes(
    target: Target,
    inputs: Mapping[str, np.ndarray],
    outputs: Asked,
    request_id: str,
    timeout_us: int = 0,
    traceparent: str | None = None,
) -> bytes:
    return messages.build_request_bytes(
        target.model,
        inputs,
        model_version=target.version,
        request_id=request_id,
        outputs=outputs.names,
        timeout_us=timeout_us,
        classification=outputs.classification,
        traceparent=traceparent,
    )
