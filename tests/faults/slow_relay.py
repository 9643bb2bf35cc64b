"""A slow step for the fault suite: a real gRPC process in front of a v2 service that holds
every ModelInfer for `--delay-ms` before forwarding it (other RPCs pass at once).

`python -m tests.faults.slow_relay --upstream HOST:PORT --delay-ms 400 --port 0
--port-file F`. Forwarded calls keep the caller's remaining deadline; a call whose caller
has gone while it waited is never forwarded. On SIGTERM it prints
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

from protos.channels import channel_options

COUNTS: Counter[str] = Counter()


class Relay(grpc.GenericRpcHandler):
    def __init__(self, channel: grpc.aio.Channel, delay_s: float) -> None:
        self.channel = channel
        self.delay_s = delay_s

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
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
