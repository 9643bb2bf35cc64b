"""Open N idle HTTP/2 connections to a port and hold them (a client preface and an empty
SETTINGS frame each, then nothing); print how many are open, then again when asked (a line
on standard input), until standard input closes. Its own process: the tests' process has
other descriptors to keep.
Usage: python tests/hostile/idle_connections.py PORT N
"""

from __future__ import annotations

import asyncio
import sys

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


async def main(port: int, count: int) -> None:
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(count):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        writer.write(PREFACE)
        held.append((reader, writer))

    def still_open() -> int:
        # A connection the server closed has seen EOF (its frames, if any, are unread).
        return sum(1 for reader, _ in held if not reader.at_eof() and not reader.exception())

    loop = asyncio.get_running_loop()
    await asyncio.sleep(1.0)
    print(len(held), still_open(), flush=True)
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(len(held), still_open(), flush=True)
    for _, writer in held:
        writer.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
