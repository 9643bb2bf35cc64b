"""Network namespaces for fault tests: a service runs in its own namespace, joined to the
tests' by a veth pair, so that its packets can be dropped (a node that vanished: no reset,
no answer) or refused (reset) by iptables rules inside that namespace only. Needs root and
iptables (`./mesh test` installs it in CI); the addresses are the pair's own /30."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

NEEDS = "root and iptables (network namespaces, veth, iptables inside them)"


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("iptables")


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


class Netns:
    """One namespace, `address` its end of a veth pair whose other end is in ours."""

    def __init__(self, index: int) -> None:
        tag = f"{os.getpid() % 100000}x{index}"
        self.name = f"meshtest{tag}"
        self._outer, self._inner = f"mo{tag}", f"mi{tag}"
        self.address = f"10.213.{index}.2"
        self._gateway = f"10.213.{index}.1"

    def create(self) -> None:
        _run("ip", "netns", "add", self.name)
        _run("ip", "link", "add", self._outer, "type", "veth", "peer", "name", self._inner)
        _run("ip", "link", "set", self._inner, "netns", self.name)
        _run("ip", "addr", "add", f"{self._gateway}/30", "dev", self._outer)
        _run("ip", "link", "set", self._outer, "up")
        self.exec("ip", "addr", "add", f"{self.address}/30", "dev", self._inner)
        self.exec("ip", "link", "set", self._inner, "up")
        self.exec("ip", "link", "set", "lo", "up")

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self._outer], capture_output=True, timeout=30)

    @property
    def prefix(self) -> tuple[str, ...]:
        """Put before a command to run it in the namespace."""
        return ("ip", "netns", "exec", self.name)

    def exec(self, *cmd: str) -> None:
        _run(*self.prefix, *cmd)

    def blackhole(self) -> None:
        """Every packet in or out dropped: the peer sees silence, as of a vanished node."""
        self.exec("iptables", "-A", "INPUT", "-i", self._inner, "-j", "DROP")
        self.exec("iptables", "-A", "OUTPUT", "-o", self._inner, "-j", "DROP")

    def refuse(self) -> None:
        """Every TCP packet in answered with a reset."""
        self.exec(
            "iptables", "-A", "INPUT", "-i", self._inner, "-p", "tcp",
            "-j", "REJECT", "--reject-with", "tcp-reset",
        )  # fmt: skip

    def heal(self) -> None:
        self.exec("iptables", "-F")


@contextmanager
def namespace(index: int) -> Iterator[Netns]:
    ns = Netns(index)
    ns.delete()  # left over by a killed run
    ns.create()
    try:
        yield ns
    finally:
        ns.delete()
