"""schemathesis against the proxy's own OpenAPI document, on the running mesh: no 500s, and
every answer (status, content type, body) is one the document declares.

Image bodies are a mix of real images (digits and text pages, so whole pipelines run),
truncated and mutated ones, and random bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.core.transport import Response
from schemathesis.schemas import APIOperation, BaseSchema
from schemathesis.specs.openapi.checks import positive_data_acceptance

from samples.images import encode, render_digit, text_samples
from tests.conftest import Mesh


def _images() -> list[bytes]:
    digits = [encode(render_digit(np.eye(8) * 16)), encode(render_digit(np.ones((8, 8)) * 9))]
    pages = [blob for blob, _ in text_samples(2, seed=5)]
    return digits + pages


@st.composite
def image_bytes(draw: st.DrawFn) -> bytes:
    real = draw(st.sampled_from(_IMAGES))
    kind = draw(st.sampled_from(["real", "truncated", "mutated", "random"]))
    if kind == "real":
        return real
    if kind == "truncated":
        return real[: draw(st.integers(0, len(real) - 1))]
    if kind == "mutated":
        data = bytearray(real)
        for _ in range(draw(st.integers(1, 16))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    return draw(st.binary(max_size=2048))


_IMAGES = _images()
for _name in ("image/*", "image/png", "application/octet-stream"):
    schemathesis.openapi.media_type(_name, image_bytes())


def no_internal_error(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Instead of schemathesis' "no 5xx": a gateway's 503 (unavailable, at capacity) and
    504 (budget spent, e.g. X-Request-Timeout-Ms: 0.2) are answers; a 500, 501 or 502 means
    a bug in the proxy or a service, except the 501 of a model load or unload (the proxy
    has no model repository: its designed answer, documented as such)."""
    if response.status_code == 501 and case.operation.path.startswith("/v2/repository/models/"):
        return None
    if response.status_code in (500, 501, 502):
        raise AssertionError(f"{response.status_code}: {response.text[:500]}")
    return None


@pytest.fixture(scope="module")
def proxy_url(request: pytest.FixtureRequest, mesh: Mesh) -> Iterator[str]:
    """The mesh's proxy, or a second one over the same services calling them the old way
    (unary calls, no merging): the same document must hold on both."""
    if request.param == "old path":
        with mesh.extra_proxy(27485, PROXY_TRANSPORT="unary", PROXY_MERGE="false") as url:
            yield url
    else:
        yield mesh.url


@pytest.fixture(scope="module")
def api(proxy_url: str) -> BaseSchema:
    schema = schemathesis.openapi.from_url(f"{proxy_url}/openapi.json")
    # 408 refuses invalid data too: a request whose budget (X-Request-Timeout-Ms, e.g.
    # 5e-324) ends before its body is read is refused for that, whatever the body; which of
    # the two the proxy sees first depends on how busy the machine is.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "408"]
    return schema


def _operations(api: BaseSchema) -> list[APIOperation]:
    return [result.ok() for result in api.get_all_operations()]


@pytest.mark.parametrize(
    ("proxy_url", "mode"),
    [
        ("streams, merged calls", GenerationMode.POSITIVE),
        ("streams, merged calls", GenerationMode.NEGATIVE),
        # Invalid requests are refused at the door, before a transport is chosen: the old
        # path adds nothing there (13-26 s of the suite).
        ("old path", GenerationMode.POSITIVE),
    ],
    indirect=["proxy_url"],
)
def test_answers_conform_to_the_schema(api: BaseSchema, mode: GenerationMode) -> None:
    # schemathesis' own pytest plugin does not run under pytest 9 yet; drive Hypothesis
    # directly, one operation at a time, and report every operation that failed.
    failures: dict[str, str] = {}
    tested: list[str] = []
    for operation in _operations(api):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def check(case: Case) -> None:
            # A schema-valid body is any bytes, not always a decodable image: its 400 (naming
            # the problem) is right, so "positive data must be accepted" does not apply.
            case.call_and_validate(
                timeout=30,
                excluded_checks=[positive_data_acceptance, not_a_server_error],
                additional_checks=[no_internal_error],
            )

        try:
            check()
            tested.append(operation.label)
        except Unsatisfiable:
            # Negative mode on an operation whose every input is free-form: nothing to break.
            assert mode == GenerationMode.NEGATIVE, operation.label
        except Exception as exc:  # every failing operation is reported, not just the first
            failures[operation.label] = str(exc)[:2000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert "POST /v1/pipelines/{name}/infer" in tested
    assert "POST /v2/models/{model}/infer" in tested
