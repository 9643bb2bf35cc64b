"""The jobs door's answers, for the OpenAPI document (proxy/doors/jobs.py builds them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobAccepted(BaseModel):
    id: str
    status: Status
    pipeline: str
    created: str = Field(description="ISO 8601, UTC")


class JobCallback(BaseModel):
    url: str
    status: str | None = Field(
        description='null until tried; "delivered", "refused: <why>" (a 4xx answer: not tried '
        'again) or "retrying: <the last failure>" (tried again until delivered or the job is '
        "removed)"
    )


class JobView(BaseModel):
    id: str
    pipeline: str
    status: Status
    created: str
    updated: str
    attempts: int = Field(description="attempts started so far")
    finished: str | None = None
    result: dict[str, Any] | None = Field(
        None, description="what /infer answers (status succeeded)"
    )
    error: dict[str, Any] | None = Field(
        None,
        description="the last error as /infer gives it, with its HTTP `status` (a failed job,"
        " or a queued one about to be tried again)",
    )
    callback: JobCallback | None = None


class JobList(BaseModel):
    jobs: list[JobView]
    next: str | None = Field(description="`cursor` of the next page; null on the last")
