"""Everything the proxy's handlers share, built once from the settings and environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from protos.tls import channel_credentials
from proxy import definitions, plan
from proxy.admission import Admission, PipelineLimits
from proxy.client import Channels
from proxy.executor import Executor
from proxy.settings import ProxySettings
from proxy.uploads import UploadLimits


@dataclass
class ProxyState:
    settings: ProxySettings
    plans: dict[str, plan.Plan]
    channels: Channels
    executor: Executor
    admission: Admission
    uploads: UploadLimits

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
        )
        executor = Executor(channels, merge=settings.merge)
        return cls(settings, plans, channels, executor, admission, settings.upload_limits())

    def models(self) -> dict[str, str]:
        """Model name -> address of the first endpoint any pipeline uses for it."""
        hosts: dict[str, str] = {}
        for resolved in self.plans.values():
            for target in resolved.targets.values():
                hosts.setdefault(target.model, target.address)
        return hosts


def _limits(pipeline: definitions.Pipeline) -> PipelineLimits:
    mpx = pipeline.max_inflight_mpx
    return PipelineLimits(pipeline.max_in_flight, None if mpx is None else int(mpx * 1e6))
