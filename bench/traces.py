"""`python -m bench traces`: what seeing inside a request costs, measured in one run, rounds
interleaved, digits at c=1 and c=8:

- traces on vs off: two meshes of the shipped topology side by side, one with traces off
  (the default) and one with every process exporting every request's spans (100% sampling)
  over OTLP/gRPC to a receiver in its own process (bench/otlp_receiver.py);
- off vs before: a third mesh run from the files of an earlier commit (`--before`, by
  default the last one before issue 29's traces), on the same venv and model repository;
- the console's record off (PROXY_CONSOLE=false): a second proxy over the first mesh's
  services.

Only one system is loaded at a time."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.cache import digit
from bench.httpload import post_bytes
from bench.loadgen import Stats
from bench.mesh import (
    HEADER,
    ROOT,
    free_port,
    http_closed_loop,
    interleaved,
    proxy_url,
    row,
    second_proxy,
    shipped_mesh,
)

BEFORE = "b648b2d"
"""The last commit before issue 29's traces (bda8b48) entered the hot paths."""
GOALS = (
    "Goals (issue 29): traces on (100% sampling, exported) >= 0.9x traces off at c=8; "
    "traces off >= 0.98x before the issue."
)
RUN_BEFORE = """
import sys, tempfile
from compose.local import DEFAULT_FILE, LocalMesh
from compose.topology import load
folder = tempfile.mkdtemp(prefix="bench-before-mesh-")
environ = {"PROXY_CACHE": "false", "PROXY_JOBS_URL": f"sqlite:///{folder}/jobs.sqlite3"}
services = load([DEFAULT_FILE], environ=environ, port_offset=17000, leave_out={"redis"})
with open(f"{folder}/mesh.log", "w") as log:
    mesh = LocalMesh(services, out=log)
    mesh.up()
    try:
        print(f"http://127.0.0.1:{services['proxy'].env['PROXY_PORT']}", flush=True)
        sys.stdin.read()
    finally:
        mesh.down()
"""
"""Run in the earlier tree (its files first on the path): its mesh as bench/mesh.py's
shipped_mesh starts one (the same settings), until stdin closes."""


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


@contextlib.contextmanager
def earlier_tree(rev: str) -> Iterator[Path]:
    """Commit `rev`'s files (`git archive`) in a temporary folder, with the model repository
    this tree built; run from it (its files first on the path), a process is that commit."""
    with tempfile.TemporaryDirectory(prefix="bench-before-") as folder:
        archive = subprocess.run(
            ["git", "archive", rev], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        tree = Path(folder)
        (tree / "models" / "repository").symlink_to(ROOT / "models" / "repository")
        yield tree


@contextlib.contextmanager
def earlier_mesh(rev: str) -> Iterator[str]:
    """The shipped mesh as commit `rev` had it (ports +17000); yields its proxy's URL."""
    with earlier_tree(rev) as tree:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUN_BEFORE],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("http://"), f"the mesh of {rev} did not start"
            yield url
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(120)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="what traces cost, on digits")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default=BEFORE, help="the earlier commit to compare with")
    args = parser.parse_args(argv)
    path = "/v1/pipelines/digits/infer"
    image = digit()
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(receiver_process())
        mesh = stack.enter_context(shipped_mesh("bench-traces-off"))
        off = proxy_url(mesh)
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
        on = proxy_url(stack.enter_context(shipped_mesh("bench-traces-on", 14500, traced)))
        before = stack.enter_context(earlier_mesh(args.before))
        quiet = {**mesh.services["proxy"].env, "PROXY_CONSOLE": "false"}
        no_console = stack.enter_context(second_proxy(quiet))

        def load(url: str, c: int) -> Stats:
            raw = post_bytes(url + path, image, "image/png")
            return asyncio.run(http_closed_loop(url, raw, c, args.duration))

        systems = {
            "traces off": off,
            "traces on, every request": on,
            f"before ({args.before})": before,
            "traces off, console's record off": no_console,
        }
        table = interleaved(systems, load, (1, 8), args.rounds)
    print("\n### `digits`: traces on and off, and before them\n")
    print(HEADER)
    for c, stats in table.items():
        base = stats["traces off"]
        for label, s in stats.items():
            print(row(label, c, s, base))
    at8 = table[8]
    ratio = at8["traces on, every request"].rps / at8["traces off"].rps
    versus = at8["traces off"].rps / at8[f"before ({args.before})"].rps
    print(f"\n{GOALS}\n- c=8: on/off {ratio:.2f}x; off/before {versus:.2f}x")
    return 0
