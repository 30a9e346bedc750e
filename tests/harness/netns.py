"""Hosts as Linux network namespaces: one namespace per host, a veth pair each to a bridge
that lives in a namespace of its own, and private addresses (10.213.N.0/24) only.

Nothing is created in the machine's own namespace: no interface, address or route of the
host's is touched, and its processes reach the hosts' servers through Unix sockets (which
namespaces do not separate), never through an address. Every name carries a random
suffix, and `Network.destroy` (also run at exit) deletes the namespaces, which takes
their veths and the bridge with them.
"""

import atexit
import contextlib
import random
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be created here (not root, no iproute2, no kernel support)."""


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def check_available() -> None:
    """Try to make (and delete) a namespace; NetnsUnavailable says why it failed."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("iproute2's `ip` is not installed")
    name = f"qfmh-probe-{secrets.token_hex(3)}"
    try:
        ip("netns", "add", name)
    except RuntimeError as exc:
        raise NetnsUnavailable(f"cannot create a network namespace: {exc}") from exc
    ip("netns", "del", name)


@dataclass
class Network:
    """The namespaces of `hosts` on one bridge, host i at 10.213.N.(i+1)."""

    hosts: tuple[str, ...]
    suffix: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: int = field(default_factory=lambda: random.randint(1, 254))
    made: list[str] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"qfmh-{self.suffix}-net"

    def ns(self, host: str) -> str:
        return f"qfmh-{self.suffix}-{host}"

    def address(self, host: str) -> str:
        return f"10.213.{self.subnet}.{self.hosts.index(host) + 1}"

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """argv run inside `host`'s namespace (ip netns exec replaces itself with it)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def create(self) -> "Network":
        atexit.register(self.destroy)
        try:
            self._add_ns(self.bridge_ns)
            ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            ip("-n", self.bridge_ns, "link", "set", "br0", "up")
            for host in self.hosts:
                self._add_ns(self.ns(host))
                port = self.port(host)
                ip("-n", self.bridge_ns, "link", "add", port, "type", "veth",
                   "peer", "name", "eth0", "netns", self.ns(host))
                ip("-n", self.bridge_ns, "link", "set", port, "master", "br0")
                ip("-n", self.bridge_ns, "link", "set", port, "up")
                ip("-n", self.ns(host), "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                ip("-n", self.ns(host), "link", "set", "eth0", "up")
                ip("-n", self.ns(host), "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def port(self, host: str) -> str:
        """The bridge's end of `host`'s veth pair."""
        return f"v{host}"

    def set_link(self, host: str, up: bool) -> None:
        """Take `host`'s veth down (a cable pulled: cut off from every other host) or up."""
        ip("-n", self.bridge_ns, "link", "set", self.port(host), "up" if up else "down")

    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.made.append(name)

    def destroy(self) -> None:
        """Delete our namespaces (their veths and the bridge go with them); idempotent."""
        while self.made:
            name = self.made.pop()
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                ip("netns", "del", name)
