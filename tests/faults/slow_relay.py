"""A slow step for the fault suite: a real gRPC process in front of a v2 service that holds
every ModelInfer, and every request of a ModelStreamInfer, for `--delay-ms` before forwarding
it (other RPCs pass at once).

`python -m tests.faults.slow_relay --upstream HOST:PORT --delay-ms 400 --port 0
--port-file F`. Forwarded calls keep the caller's remaining deadline (on a stream: the
request's `timeout` parameter); a call whose caller has gone while it waited (on a stream:
cancelled by a `cancel` message, or out of time) is never forwarded. On SIGTERM it prints
`relay: received N, forwarded F, abandoned A` for the test to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections import Counter
from pathlib import Path

import grpc

from protos import pb
from protos.channels import (
    METHOD_PREFIX,
    STREAM_CANCEL_PARAMETER,
    STREAM_STATUS_PARAMETER,
    channel_options,
)

COUNTS: Counter[str] = Counter()


class Relay(grpc.GenericRpcHandler):
    def __init__(self, channel: grpc.aio.Channel, delay_s: float) -> None:
        self.channel = channel
        self.delay_s = delay_s

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        if method.endswith("/ModelStreamInfer"):
            return grpc.stream_stream_rpc_method_handler(
                self.stream,
                request_deserializer=pb.ModelInferRequest.FromString,
                response_serializer=pb.ModelStreamInferResponse.SerializeToString,
            )
        upstream = self.channel.unary_unary(method)  # bytes in, bytes out
        slow = method.endswith("/ModelInfer")

        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if slow:
                COUNTS["received"] += 1
                try:
                    await asyncio.sleep(self.delay_s)
                except asyncio.CancelledError:
                    COUNTS["abandoned"] += 1
                    raise
                COUNTS["forwarded"] += 1
            try:
                return await upstream(request, timeout=context.time_remaining())
            except grpc.aio.AioRpcError as e:
                await context.abort(e.code(), e.details() or "")
                raise  # abort raises; this keeps type checkers honest

        return grpc.unary_unary_rpc_method_handler(handle)

    async def stream(self, requests, context: grpc.aio.ServicerContext):
        """Each request held, then forwarded as a unary ModelInfer; answers in completion
        order, errors with their status code beside the message (as our services do)."""
        forward = self.channel.unary_unary(
            METHOD_PREFIX + "ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: dict[str, asyncio.Task[None]] = {}

        async def one(request: pb.ModelInferRequest) -> None:
            timeout = request.parameters["timeout"].int64_param / 1e6 or None
            COUNTS["received"] += 1
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.sleep(self.delay_s)
                    COUNTS["forwarded"] += 1
                    reply = await forward(request, timeout=timeout)
                answers.put_nowait(pb.ModelStreamInferResponse(infer_response=reply))
            except asyncio.CancelledError:
                COUNTS["abandoned"] += 1
                raise
            except TimeoutError:
                COUNTS["abandoned"] += 1
                answers.put_nowait(_error(request, grpc.StatusCode.DEADLINE_EXCEEDED, "late"))
            except grpc.aio.AioRpcError as e:
                answers.put_nowait(_error(request, e.code(), e.details() or ""))
            finally:
                running.pop(request.id, None)

        async def read() -> None:
            async for request in requests:
                if request.parameters[STREAM_CANCEL_PARAMETER].bool_param:
                    if (task := running.get(request.id)) is not None:
                        task.cancel()
                    continue
                running[request.id] = asyncio.create_task(one(request))
            while running:
                await asyncio.wait(set(running.values()))
            answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
        finally:
            reader.cancel()
            for task in list(running.values()):
                task.cancel()


def _error(
    request: pb.ModelInferRequest, code: grpc.StatusCode, text: str
) -> pb.ModelStreamInferResponse:
    about = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    about.parameters[STREAM_STATUS_PARAMETER].int64_param = code.value[0]
    return pb.ModelStreamInferResponse(error_message=text, infer_response=about)


async def main(args: argparse.Namespace) -> None:
    # Same message limits as the services it stands in front of.
    channel = grpc.aio.insecure_channel(args.upstream, options=channel_options())
    server = grpc.aio.server(
        handlers=[Relay(channel, args.delay_ms / 1000)], options=channel_options()
    )
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    await server.start()
    Path(args.port_file).write_text(json.dumps({"grpc": port, "metrics": None}))  # noqa: ASYNC240
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(1)
    await channel.close()
    print(
        f"relay: received {COUNTS['received']}, forwarded {COUNTS['forwarded']}, "
        f"abandoned {COUNTS['abandoned']}",
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=0, help="ignored")
    parser.add_argument("--port-file", required=True)
    asyncio.run(main(parser.parse_args()))
