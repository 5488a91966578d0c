"""Who waits for a sandbox's last process: bubblewrap's process that is the sandbox's pid 1 may end just
after the bubblewrap the service started has reported and exited, and is then an orphan. The machine's init
waits for orphans, but may do so slowly (a container's init, or none: a service that is pid 1 in its
image), and until then each counts against its user's process limit, so the next sandbox of that user
cannot start. The service therefore adopts its orphans (a child subreaper) and waits for them itself: only
dead processes of the sandboxes' own user ids that no running Popen owns, so nothing another part of the
process started is taken from it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
PAUSE = 0.1  # seconds between looks

lock = threading.Lock()  # held from a sandbox's start until its pid is in `running`, and by each look
running: set[int] = set()  # pids of the sandboxes' own Popen objects: their owners wait for them


def adopt(uids: range) -> bool:
    """Make this process its orphans' parent and wait for the dead ones of `uids` on a thread; False where
    it cannot (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return False
    threading.Thread(target=_loop, args=(uids,), name="meshrl-sandbox-reaper", daemon=True).start()
    return True


def _loop(uids: range) -> None:
    while True:
        time.sleep(PAUSE)
        found = dead_orphans(uids)  # looked for without the lock: starting sandboxes need not wait
        with lock:
            for pid in found:
                if pid in running:  # a sandbox that ended at once, its Popen not yet waiting: its own
                    continue
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def dead_orphans(uids: range) -> list[int]:
    """This process's dead children owned by one of `uids` that no Popen of ours waits for."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in running:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
            owner = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == me and owner in uids:
            found.append(int(name))
    return found
