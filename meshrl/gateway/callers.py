"""Which local process is calling: an episode's API key is bound to the processes of its agent.

A run gives each agent episode a key of its own, and any process of the run's user can read another's key
(an agent command's environment in /proc/PID/environ). So a key the run bound to a process (its agent
command, or the worker process playing it) is taken only from a connection whose client end that process,
or one below it, holds: the client's (address, port) is looked up in the kernel's socket table
(/proc/net/tcp, tcp6) for its inode, and the inode among the open files of the bound process and its
descendants. A connection from elsewhere (another host, a process outside the tree, one that double-forked
away from it) is refused with 403; a key bound to no process (the endpoint's own keys, `meshrl serve
gateway`) is not checked. Linux only, like the rest of the run's process handling.
"""

import ipaddress
import os
import pathlib

PROC = pathlib.Path("/proc")


def _hex(host: str, port: int) -> str:
    """An address as /proc/net/tcp{,6} writes a local end: each 32-bit word in the host's order, then port."""
    raw = ipaddress.ip_address(host).packed
    words = "".join(f"{int.from_bytes(raw[i : i + 4], 'little'):08X}" for i in range(0, len(raw), 4))
    return f"{words}:{port:04X}"


def socket_inode(peer: tuple, server: tuple) -> int | None:
    """The inode of the local socket connected from `peer` (host, port, ...) to `server`, or None. Both ends
    are matched: the same client port may also stand in a closed connection to another server (TIME_WAIT,
    inode 0), listed before the live one."""
    family = ipaddress.ip_address(peer[0])
    table = "tcp6" if family.version == 6 else "tcp"
    want = (_hex(peer[0], peer[1]), _hex(server[0], server[1]))
    try:
        lines = (PROC / "net" / table).read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 9 and (fields[1], fields[2]) == want and fields[9] != "0":
            return int(fields[9])
    return None


def tree(root: int) -> set[int]:
    """`root` and every process below it, from the parents /proc gives."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name, which may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def holds(pid: int, inode: int) -> bool:
    target = f"socket:[{inode}]"
    try:
        fds = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(PROC / str(pid) / "fd" / fd) == target:
                return True
        except OSError:
            continue
    return False


def calls_from(root: int, peer: tuple, server: tuple) -> bool:
    """Whether the connection from `peer` to `server` (its two ends) is held by `root` or a process below it."""
    inode = socket_inode(peer, server)
    return inode is not None and any(holds(pid, inode) for pid in tree(root))
