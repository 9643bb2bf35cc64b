"""Open N idle HTTP/2 connections to a port and hold them (a client preface and an empty
SETTINGS frame each, then nothing; what the server sends is read and dropped); print how
many are open, then again when asked (a line on standard input), until standard input
closes. Its own process: the tests' process has other descriptors to keep.
Usage: python tests/hostile/idle_connections.py PORT N
"""

from __future__ import annotations

import asyncio
import sys

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


async def main(port: int, count: int) -> None:
    writers: list[asyncio.StreamWriter] = []
    closed = 0

    async def drain(reader: asyncio.StreamReader) -> None:
        # What the server sends (SETTINGS, a GOAWAY) is read and dropped: a closed
        # connection is one whose EOF or reset has been read (unread frames hid it).
        nonlocal closed
        try:
            while await reader.read(65536):
                pass
        except OSError:
            pass
        closed += 1

    drains = []
    for _ in range(count):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        writer.write(PREFACE)
        writers.append(writer)
        drains.append(asyncio.ensure_future(drain(reader)))

    loop = asyncio.get_running_loop()
    await asyncio.sleep(1.0)
    print(len(writers), len(writers) - closed, flush=True)
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(len(writers), len(writers) - closed, flush=True)
    for writer in writers:
        writer.close()
    for task in drains:
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
