"""`python -m bench door`: where the gRPC door's unary calls lose to the REST door (issue 30).

`digits` through the shipped mesh, rounds interleaved, each system at each concurrency:
- the REST door (`/v1`, our aiohttp-style closed loop);
- the gRPC door's unary ModelInfer, from a Python grpc.aio client and from perf_analyzer
  (Triton's C++ client) when it can run here.
For each: throughput and p50; the CPU per request of the proxy and of the services (from
/proc, all threads) and of the client (this process's, or perf_analyzer's: the same two
cores serve both, so a costlier client leaves the mesh less); the rows each merged call
carried (proxy_merged_call_members); and, at every door, the mean time a request spent in
the proxy's engine (from admission to answer) beside the client's p50: the rest is outside
the engine (the client, nginx, the HTTP and gRPC layers, the event loop's queue). At a fixed
concurrency, the fewer of the requests in flight are in the engine, the fewer rows each
merged call gathers.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import resource
import time
import urllib.request
from collections.abc import Callable

import numpy as np
from grpc import aio

from bench import perf_analyzer
from bench.capacity import cpu_s
from bench.httpload import post_bytes
from bench.loadgen import Stats, run_async
from bench.mesh import free_port, http_closed_loop, median, proxy_url, shipped_mesh
from protos import messages
from protos.channels import METHOD_PREFIX
from proxy.doors.grpc_front_nginx import front_pids


def _sum_count(text: str, metric: str, labels: str = r"[^}]*") -> tuple[float, float]:
    """(sum, count) of a histogram in /metrics text, over its series matching `labels`."""
    total = {"sum": 0.0, "count": 0.0}
    for m in re.finditer(rf"^{metric}_(sum|count)\{{{labels}\}} (\S+)", text, re.M):
        total[m.group(1)] += float(m.group(2))
    return total["sum"], total["count"]


def _counters(url: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """From one read of /metrics: (requests' calls carried, merged calls made) over every
    step (proxy_merged_call_members), and (seconds in the proxy's engine, `digits` requests):
    the engine's own time for every door alike (proxy_request_duration_seconds, from the
    request's admission to its answer)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    merged = _sum_count(text, "proxy_merged_call_members")
    engine = _sum_count(text, "proxy_request_duration_seconds", 'pipeline="digits"')
    return merged, engine


async def _door_unary(address: str, blob: bytes, c: int, seconds: float) -> Stats:
    """Unary ModelInfer at concurrency c over one connection (as tritonclient makes)."""
    channel = aio.insecure_channel(address)
    request = messages.build_request_bytes(
        "digits", {"image": np.array([blob], dtype=object)}, outputs=["result"]
    )
    call = channel.unary_unary(
        METHOD_PREFIX + "ModelInfer",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        return await run_async(lambda: call(request, timeout=10), c, seconds)
    finally:
        await channel.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the gRPC door's unary calls against REST")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args(argv)
    from sklearn.datasets import load_digits

    from samples.images import encode, render_digit

    blob = encode(render_digit(load_digits().images[0], scale=4))
    # The door's port is nginx's (proxy/doors/grpc_front_nginx.py); the grpc.aio door
    # behind it, at a port of its own, is measured alone beside it.
    inner = free_port()
    with shipped_mesh("bench-door-", extra={"PROXY_GRPC_DOOR_PORT": str(inner)}) as mesh:
        env = mesh.services["proxy"].env
        door, url = f"127.0.0.1:{env['PROXY_GRPC_PORT']}", proxy_url(mesh)
        alone = f"127.0.0.1:{inner}"
        fronted = front_pids(mesh.procs["proxy"].pid)
        raw = post_bytes(
            url + "/v1/pipelines/digits/infer", blob, "image/png", {"X-Request-Timeout-Ms": "60000"}
        )
        window = args.duration
        doors = {"gRPC door": door} | ({"grpc.aio door alone": alone} if fronted else {})
        print(f"the gRPC door's front: {'nginx' if fronted else 'none (nginx not found)'}")
        systems: dict[str, Callable[[int], Stats]] = {
            "REST door": lambda c: asyncio.run(http_closed_loop(url, [raw], c, window)),
        }
        try:
            pa_env: dict[str, str] | None = perf_analyzer.environment()
        except perf_analyzer.Unavailable as exc:
            print(f"perf_analyzer left out: {exc}")
            pa_env = None
        for label, address in doors.items():
            systems[f"{label}, grpc.aio client"] = lambda c, a=address: asyncio.run(
                _door_unary(a, blob, c, window)
            )
            if pa_env is not None:
                systems[f"{label}, perf_analyzer"] = lambda c, a=address: perf_analyzer.measure(
                    a, "digits", c, window, input_data={"image": [blob]}, env=pa_env
                )
        nginx = {f"nginx {pid}": pid for pid in fronted}
        pids = {name: proc.pid for name, proc in mesh.procs.items()} | nginx
        print("| system | c | req/s | p50 ms | proxy (+nginx) CPU ms/req | services CPU ms/req "
              "| client CPU ms/req | rows per merged call "
              "| engine ms (mean) / client p50 |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        summaries: list[str] = []
        for c in args.concurrency:
            rounds: dict[str, list[tuple[Stats, str, float, float]]] = {n: [] for n in systems}
            for _ in range(args.rounds):
                for name, measure in systems.items():
                    cpu0 = {n: cpu_s(p)[0] for n, p in pids.items()}
                    merged0, engine0 = _counters(url)
                    client0 = _client_cpu_s()
                    started = time.monotonic()
                    stats = measure(c)
                    elapsed = time.monotonic() - started
                    client = _client_cpu_s() - client0
                    cpu1 = {n: cpu_s(p)[0] for n, p in pids.items()}
                    merged1, engine1 = _counters(url)
                    # Requests the mesh answered in the whole measurement, warm-up included.
                    answered = max(1.0, stats.requests / stats.seconds * elapsed)
                    front = [n for n in pids if n == "proxy" or n in nginx]
                    proxy = sum(cpu1[n] - cpu0[n] for n in front) / answered * 1e3
                    services = sum(cpu1[n] - cpu0[n] for n in pids if n not in front) / answered
                    calls = merged1[1] - merged0[1]
                    rows = (merged1[0] - merged0[0]) / calls if calls else 0.0
                    served = engine1[1] - engine0[1]
                    inside = (engine1[0] - engine0[0]) / served * 1e3 if served else 0.0
                    share = f"{inside:.2f} / {stats.p50_ms:.2f}" if served else "-"
                    rate = stats.requests / stats.seconds
                    cells = [f"{rate:.0f}", f"{stats.p50_ms:.2f}", f"{proxy:.2f}"]
                    client_ms = client / answered * 1e3
                    cells += [f"{services * 1e3:.2f}", f"{client_ms:.2f}", f"{rows:.1f}", share]
                    server = proxy + services * 1e3  # ms a request, every server process
                    rounds[name].append((stats, " | ".join(cells), server, client_ms))
            chosen: dict[str, tuple[Stats, float, float]] = {}
            for name, runs in rounds.items():
                best = median([s for s, _, _, _ in runs])
                line, server, client_ms = next((t, ms, cl) for s, t, ms, cl in runs if s is best)
                chosen[name] = (best, server, client_ms)
                print(f"| {name} | {c} | {line} |", flush=True)
            summaries.append(_against_rest(chosen, c))
        print("\n" + "\n".join(summaries))
    return 0


def _client_cpu_s() -> float:
    """CPU seconds of the clients: this process (the Python clients, their threads) and its
    ended children (perf_analyzer; the mesh's processes are not waited for until it stops)."""
    own, ended = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


def _against_rest(chosen: dict[str, tuple[Stats, float, float]], c: int) -> str:
    """The gRPC door's rows against REST's at `c`: throughput, the servers' CPU a request
    (proxy, nginx and services together: what the door costs, whatever the client), and the
    client's beside it."""
    rest, rest_cpu, rest_client = chosen["REST door"]
    parts = [
        f"{name.removeprefix('gRPC door, ')} {stats.rps / rest.rps:.2f}x throughput, "
        f"{cpu / rest_cpu:.2f}x server CPU a request, client {client:.2f} ms a request "
        f"(REST's {rest_client:.2f})"
        for name, (stats, cpu, client) in chosen.items()
        if name.startswith("gRPC door, ") and rest.rps and rest_cpu
    ]
    return f"- c={c}, the gRPC door against REST: " + "; ".join(parts)
