"""The shapes of the proxy's REST API, for its OpenAPI document (/docs, /openapi.json).

The handlers build their answers directly (orjson, no per-request validation); these
models describe them, and the schemathesis suite (tests/e2e/test_openapi.py) checks that
every answer the running mesh gives conforms to them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StepReport(BaseModel):
    name: str = Field(description="the step, or `<parallel step>/<branch>` for a branch")
    status: str = Field(
        description="ok, partial (some branches failed), cancelled, or the lower-case gRPC "
        "status of its failure (deadline_exceeded, unavailable, ...)"
    )
    latency_ms: float
    error: str | None = None
    cache: str | None = Field(
        default=None, description="a step with the data cache: hit or miss (else null)"
    )
    start_ms: float = Field(
        default=0.0, description="when it began, from the moment the proxy took the request"
    )
    variant: str | None = Field(
        default=None,
        description="a step with a canary (<VARIABLE>_CANARY): live or canary, the model that "
        "answered (else null)",
    )


class PipelineAnswer(BaseModel):
    id: str = Field(description="the request id (X-Request-Id, given or generated)")
    pipeline: str
    result: Any = Field(description="shaped by the pipeline's `result` template")
    partial: bool = Field(description="true when a partial step answered without some branch")
    steps: list[StepReport]
    latency_ms: float


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    error: str = Field(description="what went wrong, naming the input, step or limit")
    id: str = Field(description="the request id, for the logs")
    step: str | None = Field(None, description="the failed step, when a step failed")
    code: str | None = Field(None, description="the gRPC status of a failed downstream call")
    pipeline: str | None = None


class Liveness(BaseModel):
    live: bool


class EndpointReadiness(BaseModel):
    address: str
    model: str
    ready: bool
    error: str | None = None


class Readiness(BaseModel):
    ready: bool
    endpoints: dict[str, EndpointReadiness] = Field(
        description="one entry per `<VARIABLE>/<model>` any pipeline calls"
    )


class TargetInfo(BaseModel):
    endpoint: str
    address: str
    model: str
    version: str = ""


class PipelineInfo(BaseModel):
    description: str
    timeout_ms: float
    targets: dict[str, TargetInfo]
    definition: dict[str, Any]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str] = []
    platform: str = ""
    inputs: list[TensorMetadata] = []
    outputs: list[TensorMetadata] = []


class ServerReady(BaseModel):
    ready: bool


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelReadiness(BaseModel):
    name: str
    ready: bool
    error: str | None = None


class RequestInput(BaseModel):
    name: str
    shape: list[int] = Field(description="non-negative dimensions")
    datatype: str = Field(description="a v2 datatype: BOOL, UINT8..UINT64, INT8..INT64, FP32, ...")
    data: list[Any] | None = Field(
        default=None,
        description="row-major values, flat or nested; absent when the tensor travels in "
        "binary (parameters.binary_data_size, Inference-Header-Content-Length)",
    )
    parameters: dict[str, Any] | None = None


class RequestOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str
    id: str
    outputs: list[ResponseOutput]


class CacheCleared(BaseModel):
    pipeline: str
    cleared: int = Field(description="entries dropped")


class IndexRequest(BaseModel):
    ready: bool = False
    """List only the models ready now."""


class IndexEntry(BaseModel):
    name: str
    version: str = ""
    state: str = ""
    """READY or UNAVAILABLE."""
    reason: str = ""


class Statistics(BaseModel):
    model_stats: list[dict[str, Any]]
    """Per model version: Triton's counters (inference_count, execution_count,
    inference_stats, batch_stats)."""


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for the error answers a route can give."""
    why = {
        400: "bad input (the message names it)",
        401: "missing or wrong API key (when PROXY_API_KEY is set)",
        404: "unknown pipeline, model or job",
        408: "the body arrived too slowly (PROXY_MIN_UPLOAD_KBPS) or after the budget",
        413: "body over PROXY_MAX_BODY_MB, or a request's tensors over PROXY_MAX_REQUEST_MB",
        409: "the job has already ended",
        415: "unsupported Content-Type, or an upload that is not an accepted image format",
        422: "multipart body without a `file` field; an Idempotency-Key reused for another body",
        429: "a service's queue, or the jobs' queue, is full (Retry-After)",
        501: "a service does not implement the call",
        502: "a service failed in an unexpected way",
        503: "a service or the jobs' store is unavailable, or the proxy is at capacity "
        "(Retry-After)",
        504: "the request's budget ran out",
    }
    return {s: {"model": ErrorBody, "description": why[s]} for s in statuses}


BINARY = {"type": "string", "format": "binary"}
IMAGE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "image/*": {"schema": BINARY},
            "application/octet-stream": {"schema": BINARY},
            "multipart/form-data": {
                "schema": {"type": "object", "required": ["file"], "properties": {"file": BINARY}}
            },
            # A pipeline declaring `inputs` (e.g. digits-features): name -> nested lists.
            "application/json": {
                "schema": {
                    "type": "object",
                    "additionalProperties": {"type": "array"},
                    "example": {"features": [[0, 0, 5, 13, 9, 1, 0, 0] * 8]},
                }
            },
        },
    },
    "parameters": [
        {
            "name": "X-Request-Timeout-Ms",
            "in": "header",
            "required": False,
            "description": "this request's budget in milliseconds (capped by PROXY_MAX_TIMEOUT_MS)",
            "schema": {"type": "number", "exclusiveMinimum": 0},
        },
        {
            "name": "X-Request-Id",
            "in": "header",
            "required": False,
            "description": "kept when 1-128 of [A-Za-z0-9._:-], else replaced; echoed, logged",
            "schema": {"type": "string"},
        },
    ],
}


def add_components(openapi: dict[str, Any], *models: type[BaseModel]) -> None:
    """Put models that only appear in `openapi_extra` into the document's components."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema


def json_body(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """`openapi_extra` for a JSON body the handler parses itself (see add_components)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    content = {"application/json": {"schema": ref}}
    return {"requestBody": {"required": required, "content": content}}


def enumerate_path_parameters(openapi: dict[str, Any], values: dict[str, list[str]]) -> None:
    """Document the values a path parameter can take (pipelines, models): not enforced, an
    unknown one gets our 404 naming the known ones."""
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter.get("name") in values:
                    parameter["schema"]["enum"] = values[parameter["name"]]
