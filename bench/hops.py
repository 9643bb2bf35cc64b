"""The unavoidable hops of a pipeline, measured: the same topology with nothing in it.

Every endpoint process becomes an echo (a grpc.aio server whose ModelInfer answers the
request's own bytes, unparsed) and the proxy a bare ASGI relay on uvicorn (the proxy's loop
and HTTP parser) that walks the pipeline's call and parallel steps with grpc.aio, passing
each answer's bytes on. Nothing is decoded, validated, computed, recorded or rendered, so
its latency is what one REST hop plus the pipeline's gRPC hops cost on this machine, with
the same libraries, the same number of processes and the same fan-out.

`python -m bench.hops echo PORT` and `python -m bench.hops relay PORT PIPELINES NAME` (the
endpoint variables in the environment, as for the proxy); `NullMesh` starts both.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import grpc
from grpc import aio

from bench.mesh import free_port
from protos.channels import METHOD_PREFIX, SERVICE_NAME
from proxy.doors.middleware import Receive, Scope, Send
from proxy.engine.definitions import CallStep, Entry, ParallelStep
from proxy.engine.endpoints import parse
from proxy.engine.plan import Plan, load

MODEL_INFER = METHOD_PREFIX + "ModelInfer"


async def _echo(port: int) -> None:
    async def echo(request: bytes, context: aio.ServicerContext) -> bytes:
        return request

    server = aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE_NAME,
                {"ModelInfer": grpc.unary_unary_rpc_method_handler(echo)},
            ),
        )
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


class Relay:
    """An ASGI app that runs a plan's calls against echo servers and answers `{}`."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._calls: dict[str, aio.UnaryUnaryMultiCallable] = {}
        self._channels: list[aio.Channel] = []

    def _call(self, label: str) -> aio.UnaryUnaryMultiCallable:
        call = self._calls.get(label)
        if call is None:
            channel = aio.insecure_channel(self.plan.targets[label].address)
            self._channels.append(channel)
            call = self._calls[label] = channel.unary_unary(MODEL_INFER)
        return call

    async def _steps(self, entries: list[Entry], body: bytes) -> bytes:
        for entry in entries:
            step = entry.step
            if isinstance(step, CallStep):
                body = await self._call(step.name)(body, timeout=5)
            elif isinstance(step, ParallelStep):
                names = self.plan.branches(step)
                answers = await asyncio.gather(
                    *(self._call(f"{step.name}/{n}")(body, timeout=5) for n in names)
                )
                body = answers[0]
            else:  # a switch: its default path (echoes carry no data to decide on)
                body = await self._steps(step.default, body)
        return body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        await self._steps(self.plan.pipeline.steps, body)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")],
            }
        )
        await send({"type": "http.response.body", "body": b"{}"})


def _wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port}")


class NullMesh:
    """Echo processes (one per distinct endpoint address of `environ`) and a relay for one
    pipeline; `url` is the relay's pipeline URL."""

    def __init__(self, pipelines: Path, name: str, environ: Mapping[str, str]) -> None:
        self.pipelines, self.name = pipelines, name
        self.environ = dict(environ)
        self.procs: list[subprocess.Popen] = []
        self.url = ""

    def __enter__(self) -> NullMesh:
        echoes: dict[str, int] = {}  # real address -> echo port: shared services stay shared
        env = {}
        for variable, value in self.environ.items():
            # Step endpoints only: PROXY_CACHE_URL, PROXY_JOBS_URL are the proxy's own stores.
            if not variable.endswith("_URL") or variable.startswith("PROXY_") or not value:
                continue
            address = parse(variable, value).address
            if address not in echoes:
                echoes[address] = port = free_port()
                self._start(["echo", str(port)], {}, port, f"echo for {variable}")
            env[variable] = f"127.0.0.1:{echoes[address]}"
        port = free_port()
        self._start(["relay", str(port), str(self.pipelines), self.name], env, port, "relay")
        self.url = f"http://127.0.0.1:{port}/v1/pipelines/{self.name}/infer"
        return self

    def _start(self, args: list[str], env: dict[str, str], port: int, what: str) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.hops", *args],
            env={**os.environ, **env},
            cwd=Path(__file__).resolve().parent.parent,
        )
        self.procs.append(proc)
        _wait_port(port, proc, what)

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(10)


def main(argv: list[str]) -> int:
    if argv[:1] == ["echo"]:
        import uvloop

        # The services' loop (v2server.server.run_service), as the relay has the proxy's.
        uvloop.run(_echo(int(argv[1])))
        return 0
    if argv[:1] == ["relay"]:
        import uvicorn

        port, path, name = int(argv[1]), Path(argv[2]), argv[3]
        plan = load(path, os.environ)[name]
        uvicorn.run(
            Relay(plan),
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            access_log=False,
        )
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
