"""`python -m bench traces`: what traces cost, measured in one run, rounds interleaved: two
meshes of the shipped topology side by side, one with traces off (the default) and one with
every process exporting every request's spans (100% sampling) over OTLP/gRPC to a receiver
in its own process (bench/otlp_receiver.py); digits at c=8 (and c=1 for the latency).
Only one mesh is loaded at a time."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys

from bench.cache import digit
from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import (
    HEADER,
    ROOT,
    free_port,
    http_closed_loop,
    median,
    proxy_url,
    row,
    shipped_mesh,
)

GOALS = "Goal (issue 29): traces on (100% sampling, exported) >= 0.9x traces off at c=8."


@contextlib.contextmanager
def receiver_process():
    """The receiver as its own process; yields its endpoint, prints how many spans it got."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.otlp_receiver", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        print(f"\nspans received: {int(out.strip() or 0):,}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="what traces cost, on digits")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    path = "/v1/pipelines/digits/infer"
    image = digit()
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(receiver_process())
        off = proxy_url(stack.enter_context(shipped_mesh("bench-traces-off")))
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
        on = proxy_url(stack.enter_context(shipped_mesh("bench-traces-on", 14500, traced)))

        def load(url: str, c: int) -> Stats:
            raw = post_bytes(url + path, image, "image/png")
            return asyncio.run(http_closed_loop(url, raw, c, args.duration))

        for url in (off, on):  # warm: streams open, lanes made, models run once
            load(url, 8)
        systems = {"traces off": off, "traces on, every request": on}
        table: dict[int, dict[str, Stats]] = {}
        for c in (1, 8):
            runs: dict[str, list[Stats]] = {label: [] for label in systems}
            for _ in range(args.rounds):
                for label, url in systems.items():
                    runs[label].append(load(url, c))
            table[c] = {label: median(r) for label, r in runs.items()}
            pairs = zip(runs["traces off"], runs["traces on, every request"], strict=True)
            rounds = ", ".join(f"{b.rps / a.rps:.2f}" for a, b in pairs)
            print(f"c={c}: on/off throughput per round: {rounds}")
    print("\n### `digits`: traces on and off\n")
    print(HEADER)
    for c, stats in table.items():
        base = stats["traces off"]
        for label, s in stats.items():
            print(row(label, c, s, base))
    ratio = table[8]["traces on, every request"].rps / table[8]["traces off"].rps
    print(f"\n{GOALS}\n- c=8: {ratio:.2f}x")
    return 0
