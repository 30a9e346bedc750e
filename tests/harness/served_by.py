"""Which process of a multi-process server answered a request, read from /proc.

`quotaflow api --workers N` serves one port from N processes; a test that must see a
request answered by each of them sends it on a connection of its own, and, while that
connection is open, finds the process holding the server's end of it: the socket whose
local port is the server's and remote port the client's (/proc/net/tcp), and the
process with that socket among its file descriptors. Nothing is added to the server.
"""

import http.client
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    pid: int
    cookies: dict[str, str] = field(default_factory=dict)


def children(pid: int) -> list[int]:
    """The processes `pid` started (uvicorn's supervisor: its worker processes)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def group(pgid: int) -> list[int]:
    """Every live process of the process group `pgid` (zombies excluded)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def listens(pid: int, port: int) -> bool:
    """Whether `pid` holds a socket listening on `port` (a process of a multi-process
    server takes connections only once it has bound its own)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _inode(server_port: int, client_port: int) -> str:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            local, remote = int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)
            if local == server_port and remote == client_port:
                return cols[9]
    raise LookupError(f"no server socket for 127.0.0.1:{client_port} -> :{server_port}")


def holder(server_port: int, client_port: int, pids: list[int]) -> int:
    """The process among `pids` holding the server's end of the connection."""
    target = f"socket:[{_inode(server_port, client_port)}]"
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pid
            except OSError:
                continue
    raise LookupError(f"none of {pids} holds {target}")


def send(port: int, pids: list[int], method: str, path: str,
         body: bytes | Iterable[bytes] | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30.0) -> Answer:
    """One request on a new connection to 127.0.0.1:port, and which of `pids` answered
    (a body given as pieces is sent chunked, as it is made)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        pid = holder(port, conn.sock.getsockname()[1], pids)
        cookies = {}
        for name, value in response.getheaders():
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                cookies[key] = rest.split(";", 1)[0]
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                      data, pid, cookies)
    finally:
        conn.close()


def connect(port: int, pids: list[int], avoid: int | None = None, tries: int = 64,
            timeout: float = 30.0) -> tuple[http.client.HTTPConnection, int]:
    """An open connection to 127.0.0.1:port and the process among `pids` that accepted it,
    one other than `avoid` (new connections until one lands there): a request sent on it
    is served by that process."""
    for _ in range(tries):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.connect()
        client_port = conn.sock.getsockname()[1]
        for _ in range(100):  # the server's end appears once its process has accepted it
            try:
                pid = holder(port, client_port, pids)
                break
            except LookupError:
                time.sleep(0.01)
        else:
            conn.close()
            continue
        if pid != avoid:
            return conn, pid
        conn.close()
    raise AssertionError(f"{tries} connections to :{port}, none accepted by a process "
                         f"of {pids} other than {avoid}")
