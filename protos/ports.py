"""A free TCP port on 127.0.0.1 for a server another process will bind.

Not one the kernel picks (bind to port 0): the kernel hands ports from its ephemeral range
to every outgoing connection and every bind(0), so a port picked there can be taken by
someone's connection between the pick and the server's bind. CI saw it: a test proxy exited
on EADDRINUSE. A port from below that range is taken only by a server that asks for it by
number, so the window closes to another picker choosing the same one of thousands.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 30000
"""Below it the project's meshes keep their fixed ports (compose's 6,380-9,113 moved by an
offset of up to 20,000, and the tests' extra proxies), which a pick must not take before
their mesh binds them."""
TRIES = 200


def ephemeral_low(path: Path = RANGE_FILE) -> int:
    """The lowest port the kernel hands out by itself (Linux's default is 32768)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    high = ephemeral_low()
    for _ in range(TRIES if high - LOWEST >= 100 else 0):
        port = random.randrange(LOWEST, high)
        with socket.socket() as sock:  # no SO_REUSEADDR: a port in TIME_WAIT is passed over
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # a range moved too low to leave room: the kernel's pick
        sock.bind((host, 0))
        return sock.getsockname()[1]
