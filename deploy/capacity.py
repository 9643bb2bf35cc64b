"""`python -m deploy.capacity --rate digits=800 --rate ocr=10`: replicas of each service for
target request rates per pipeline, and the pod sizes the Kubernetes manifests use, both
derived from `deploy/capacity.json` (CPU per request of every service, measured by
`python -m bench capacity`).

How, for each service s:
- one replica's CPU request: its share of what one proxy replica can send. A proxy replica
  serves at most 1 / loop_ms(proxy) requests per second however many cores it has (one
  asyncio loop); at utilisation U that is U / loop_ms requests per ms, which cost service s
  U * cpu_ms(s) / loop_ms(proxy) cores: one replica of every service per proxy replica,
  each as busy as the proxy. The largest over the pipelines, capped at the cores the
  measurement had (a replica is not sized beyond what was measured; the OCR models would
  take more), at least 100m;
- replicas for rates r_p: ceil(sum_p r_p * cpu_ms(s, p) / 1000 / (U * request(s))), at least
  one; the figure the HorizontalPodAutoscaler converges to when its CPU target is U.
Memory: the measured peak resident set * 1.5 as the request, twice that as the limit.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from proxy.engine.cache.caches import RENDERED_SHARE
from proxy.settings import ProxySettings

MEASURED = Path(__file__).resolve().parent / "capacity.json"
UTILISATION = 0.7
"""The HorizontalPodAutoscaler's CPU target; headroom for bursts and a failed replica."""
MIN_CPU_M = 100


@dataclass(frozen=True)
class Size:
    cpu_m: int
    """CPU request, millicores."""
    memory_mi: int
    """Memory request, MiB."""
    limit_mi: int | None = None
    """Memory limit, MiB, when not twice the request (the proxy's: proxy_memory_limit_mi)."""

    @property
    def cpu_limit_m(self) -> int:
        return 2 * self.cpu_m

    @property
    def memory_limit_mi(self) -> int:
        return self.limit_mi or 2 * self.memory_mi


def load(path: Path = MEASURED) -> dict:
    return json.loads(path.read_text())


def sizes(measured: dict) -> dict[str, Size]:
    """Every service's pod size."""
    pipelines = measured["pipelines"].values()
    cap_m = 1000 * measured["cpus"]
    out = {}
    for service, peak in measured["peak_memory_mib"].items():
        wanted = max(
            UTILISATION * p["cpu_ms_per_request"][service] / p["event_loop_ms_per_request"]["proxy"]
            for p in pipelines
        )
        cpu_m = min(cap_m, max(MIN_CPU_M, 50 * math.ceil(1000 * wanted / 50)))
        out[service] = Size(cpu_m, 16 * math.ceil(1.5 * peak / 16))
    return out


PROXY_INFLIGHT_MB = 256
"""PROXY_MAX_INFLIGHT_MB in the manifests: the bytes of uploads and tensors one proxy replica
holds before it answers 503 (14 OCR pages at the 20 MiB upload limit; more replicas take
more). The setting's default (1,024) suits one host without a memory limit."""
RESIDENT_PER_INFLIGHT = 2.2
"""Resident bytes per byte held in flight at the worst measured: 64 OCR pages of 17.7 MiB at
once into a bound of 256 MiB took a proxy from 93 to 631 MiB (2.1x: the upload, its copy
serialised for the preprocessing call, gRPC's own buffers)."""


SERVICE_RESIDENT_PER_INFLIGHT = 1.5
"""A service's resident bytes per byte of requests it holds, at the worst measured: 40 calls
of 18.9 MB sent at once to the OCR recogniser took it from 132 to 322 MiB bounded at 128 MB
(1.48x; 303 MiB with gRPC's 64 KB lookahead, not the services' 1 MB), to 423 MiB at 256
(1.14x): the messages held, the unread calls' windows, and the one batch running's work
(what a model's work costs beyond that is in its measured peak)."""
SERVICE_MIN_INFLIGHT_MB = 64
"""The services' largest message, which is read alone whatever the bound."""


def service_inflight_mb(peak_mib: float, size: Size) -> int:
    """--max-inflight-mb in a service's manifest: what its pod's memory limit leaves above
    its measured peak, as resident; so that a flood of calls waits to be read (gRPC's flow
    control) rather than the kernel ending the pod. The setting's default (1,024) suits one
    host without a memory limit: bounded at it, the recogniser reached 1,110 MiB, past its
    pod's 608 Mi."""
    room = (size.memory_limit_mi - peak_mib) / SERVICE_RESIDENT_PER_INFLIGHT
    return max(SERVICE_MIN_INFLIGHT_MB, 16 * math.floor(room / 16))


def proxy_memory_limit_mi(peak_mib: float, pipelines: dict) -> int:
    """The proxy's memory limit: what it measured at its peak, what its caches may hold
    (each pipeline's `cache.max_mb`, the steps' outputs at PROXY_CACHE_STEPS_MB's default,
    the rendered results: RENDERED_SHARE of the answers'), and the bytes it lets in flight
    as they are resident; so that a flood of uploads is answered 503 by the proxy before
    the kernel kills it."""
    answers = sum(
        (p.get("cache") or {}).get("max_mb", 0)
        for p in pipelines.values()
        if (p.get("cache") or {}).get("enabled", True)
    )
    steps_mb = ProxySettings.model_fields["cache_steps_mb"].default
    caches = answers + steps_mb + answers * RENDERED_SHARE
    wanted = peak_mib + caches + RESIDENT_PER_INFLIGHT * PROXY_INFLIGHT_MB
    return 64 * math.ceil(wanted / 64)


def replicas(measured: dict, rates: dict[str, float]) -> dict[str, int]:
    """Replicas of every service for `rates` (requests/s per pipeline)."""
    unknown = set(rates) - set(measured["pipelines"])
    if unknown:
        raise ValueError(f"no measurement for pipeline(s) {sorted(unknown)}")
    out = {}
    for service, size in sizes(measured).items():
        cores = sum(
            rate * measured["pipelines"][p]["cpu_ms_per_request"][service] / 1000
            for p, rate in rates.items()
        )
        out[service] = max(1, math.ceil(cores / (UTILISATION * size.cpu_m / 1000) - 1e-9))
    return out


def table(measured: dict, rates: dict[str, float]) -> str:
    plan = replicas(measured, rates)
    sized = sizes(measured)
    header = ["service", *[f"CPU ms per {p} request" for p in rates], "pod CPU", "replicas"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for service in plan:
        cpu = [f"{measured['pipelines'][p]['cpu_ms_per_request'][service]:.2f}" for p in rates]
        row = [service, *cpu, f"{sized[service].cpu_m}m", str(plan[service])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _rate(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not sep or rate < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PIPELINE=REQUESTS_PER_S")
    return name, rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.capacity", description=__doc__)
    parser.add_argument(
        "--rate", type=_rate, action="append", required=True, help="PIPELINE=REQUESTS_PER_S"
    )
    parser.add_argument("--measured", type=Path, default=MEASURED)
    args = parser.parse_args(argv)
    measured = load(args.measured)
    try:
        print(table(measured, dict(args.rate)))
    except ValueError as exc:
        parser.error(str(exc))
    print(
        f"\nfrom {args.measured.name} ({measured['measured']}, {measured['machine']}); "
        f"CPU target {UTILISATION:.0%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
