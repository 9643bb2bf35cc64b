"""Everything the proxy's doors share, built once from the settings and environment: the
engine (pipelines, executor, admission) on the transport (channels), and the upload limits."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from protos.tls import channel_credentials
from proxy.doors.uploads import UploadLimits
from proxy.engine import definitions, plan
from proxy.engine.admission import Admission
from proxy.engine.cache.caches import Caches
from proxy.engine.executor import Executor
from proxy.engine.predictions import PredictionLog
from proxy.engine.predictions_sinks import sink_for
from proxy.engine.recent import Recent
from proxy.engine.room import PipelineLimits
from proxy.engine.runner import Engine
from proxy.engine.wiring import Wiring
from proxy.jobs.callbacks import allowed_hosts
from proxy.jobs.model import JobsConfig
from proxy.jobs.service import Jobs
from proxy.settings import ProxySettings
from proxy.transport.calls import Calls
from proxy.transport.catalog import Catalog
from proxy.transport.channels import Channels
from proxy.transport.services import Services
from v2server.statistics import ModelStatistics


@dataclass
class ProxyState:
    settings: ProxySettings
    engine: Engine
    channels: Channels
    services: Services
    catalog: Catalog
    uploads: UploadLimits
    jobs: Jobs
    statistics: dict[str, ModelStatistics]
    """Each pipeline's Triton statistics (`/v2/models/{m}/stats`), counted by every door."""

    @classmethod
    def build(cls, settings: ProxySettings, environ: Mapping[str, str] | None = None) -> ProxyState:
        """Pipelines are loaded (and checked) here, so a bad definition fails at start-up."""
        env = os.environ if environ is None else environ
        plans = plan.load(settings.pipelines, env)
        credentials = channel_credentials(settings.tls_ca, settings.tls_cert, settings.tls_key)
        channels = Channels(
            settings.max_message_mb,
            credentials,
            streams=settings.streams_per_endpoint if settings.transport == "stream" else 0,
            balance=settings.balance,
            resolve_interval_s=settings.resolve_interval_s,
            connections=settings.connections_per_endpoint,
            keepalive_ms=settings.keepalive_ms,
        )
        admission = Admission(
            settings.max_in_flight,
            int(settings.max_inflight_mb * 2**20),
            int(settings.max_request_mb * 2**20),
            {name: _limits(plan.pipeline) for name, plan in plans.items()},
            busy_background=settings.jobs_busy_workers,
            quiet_s=settings.jobs_quiet_ms / 1000,
            shed_late=settings.shed_late,
        )
        check_s, ask_s = settings.cache_check_ms / 1000, settings.ready_timeout_ms / 1000
        services = Services(channels, refresh_s=check_s, declared=_declared(plans))
        # Models' metadata for the caches' keys, the wiring check and the v2 door alike.
        catalog = Catalog(services, check_s, ask_s)
        caches = _caches(plans, catalog, settings)
        calls = Calls(channels, services, merge=settings.merge)
        executor = Executor(calls, caches, Wiring(catalog))
        recent = Recent(settings.console_requests) if settings.console else None
        engine = Engine(plans, executor, admission, caches, recent, catalog)
        if settings.prediction_log:
            sink = sink_for(settings.prediction_log, settings.prediction_log_file_mb)
            inputs_bytes = settings.prediction_log_inputs_kb << 10
            engine.predictions = PredictionLog(
                sink, engine.result, settings.prediction_log_percent,
                settings.prediction_log_inputs, inputs_bytes, catalog.digest,
            )  # fmt: skip
        jobs = Jobs(engine, _jobs_config(settings))
        statistics = {name: ModelStatistics() for name in plans}
        limits = settings.upload_limits()
        return cls(settings, engine, channels, services, catalog, limits, jobs, statistics)


def _declared(plans: dict[str, plan.Plan]) -> dict[tuple[str, str, str], int]:
    """Every model's declared batch size (`<VARIABLE>_MAX_BATCH_SIZE`), the smallest where
    two variables point at one model."""
    found: dict[tuple[str, str, str], int] = {}
    for each in plans.values():
        for target, rows in each.declared_batches.items():
            key = (target.address, target.model, target.version)
            found[key] = min(rows, found.get(key, rows))
    return found


def _caches(
    plans: dict[str, plan.Plan], catalog: Catalog, settings: ProxySettings
) -> Caches | None:
    """The caches, when a pipeline or a step asks for one (and PROXY_CACHE allows)."""
    if not (settings.cache and Caches.wanted(plans)):
        return None
    return Caches(
        plans,
        catalog,
        url=settings.cache_url,
        steps_mb=settings.cache_steps_mb,
        timeout_s=settings.cache_timeout_ms / 1000,
    )


def _jobs_config(settings: ProxySettings) -> JobsConfig:
    return JobsConfig(
        url=settings.jobs_queue_url(),
        workers=settings.jobs_workers,
        max_queued=settings.jobs_max_queued,
        max_queued_bytes=int(settings.jobs_max_queued_mb * 1e6),
        keep_s=settings.jobs_keep_s,
        lease_s=settings.jobs_lease_s,
        attempts=settings.jobs_attempts,
        share=settings.jobs_share,
        callback_hosts=allowed_hosts(settings.jobs_callback_hosts),
        backoff_s=settings.jobs_backoff_s,
        callback_most_s=settings.jobs_callback_most_s,
        callback_hold_s=settings.jobs_callback_hold_s,
        callback_secret=(settings.jobs_callback_secret or "").encode() or None,
        min_free_bytes=int(settings.jobs_min_free_mb * 1e6),
    )


def _limits(pipeline: definitions.Pipeline) -> PipelineLimits:
    mpx = pipeline.max_inflight_mpx
    pixels = None if mpx is None else int(mpx * 1e6)
    return PipelineLimits(pipeline.max_in_flight, pixels, pipeline.max_queued)
