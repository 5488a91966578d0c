"""A fork server, the caller's side: one process (cli/forkserver.py) imports torch, transformers and the
services' modules once, and every service a run starts on this host is forked from it, instead of each
importing them again.

On two cores a run's four processes (orchestrator, actor, rollout, reward) spent ~9 CPU-seconds on the
same imports before any model loaded; forked, the services start from that state in a fraction of a
second. The server is started first thing by `meshrl <algorithm>` (start()), while the orchestrator
itself imports, and spawn() hands it a service's arguments and environment; a service forked this way
behaves like one started with subprocess: its own session, its stdout a pipe to the caller, stderr
the caller's, and it dies with the server, which dies with the caller (meshrl.lifeline).

Forked offers what callers use of subprocess.Popen (pid, stdout, poll, wait, terminate, kill). The
server reports each child's exit status over the same socket; signals go through a pidfd, so a
recycled pid is never hit. Where the server is not running (MESHRL_FORK_SERVER=0,
trainer.fork_server=false, not Linux, or it died) callers start processes as before.
"""

import array
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

VAR = "MESHRL_FORK_SERVER"  # "0": no fork server, whatever the config says
MESSAGE = 1 << 20  # a request holds one service's arguments and environment
START = 30.0  # seconds: a bound on waiting for a fork that was asked for, or for an orphan to exit
FDS = socket.CMSG_SPACE(array.array("i", [0]).itemsize)

_server: "ForkServer | None" = None
_lock = threading.Lock()
_kept = False  # a process that runs many runs (a test session) keeps one server for all of them


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and os.environ.get(VAR, "1") != "0"


def start() -> "ForkServer | None":
    """Start this process's fork server (once, or again where it died); None where it cannot run here."""
    global _server
    with _lock:
        if (_server is None or _server.gone.is_set()) and available():
            if _server is not None:
                _server.close()  # the dead one's socket and exit status
            _server = ForkServer()
        return _server


def keep() -> None:
    """From now on this process keeps one fork server for all its runs: the first service asked for starts
    it, and a run's end (stop()) leaves it up; release() stops it. A process that runs many runs in turn (a
    test session) imports the services' modules once instead of once a service of each run."""
    global _kept
    _kept = True


def running() -> "ForkServer | None":
    """The fork server if it is up (where this process keeps one, started now), else None (callers then
    start processes themselves)."""
    if _kept:
        start()
    return _server if _server is not None and not _server.gone.is_set() else None


def died(timeout: float = START) -> bool:
    """True when this process's fork server exited without being stopped (killed, or it crashed); waits
    up to `timeout` until the services it had forked are accounted for (they die with it), so that their
    callers see them dead rather than a refused call."""
    server = _server
    if server is None or not server.gone.is_set():
        return False
    server.settled.wait(timeout)
    return True


def kill() -> None:
    """SIGKILL to the fork server without waiting (Ctrl-C's stop of last resort; not under the lock, which a
    thread may hold)."""
    server = _server
    if server is not None:
        server.kill()


def stop() -> None:
    """Stop the fork server, unless this process keeps it (keep()); the services it forked get SIGTERM
    (meshrl.lifeline)."""
    if not _kept:
        release()


def release() -> None:
    """Stop the fork server whoever started it, and keep none from now on."""
    global _server, _kept
    _kept = False
    with _lock:
        if _server is not None:
            _server.close()
            _server = None


def send(sock: socket.socket, message: dict, fd: int | None = None) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd is not None else []
    sock.sendmsg([json.dumps(message).encode()], ancillary)


def receive(sock: socket.socket) -> tuple[dict | None, int | None]:
    """One message and the descriptor that came with it; (None, None) when the other end closed."""
    data, ancillary, _, _ = sock.recvmsg(MESSAGE, FDS)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None, None
    return json.loads(data), (fds[0] if fds else None)


class Forked:
    """A process the fork server started: what its callers use of subprocess.Popen."""

    def __init__(self, args: list[str], stdout_fd: int):
        self.args = args
        self.stdout = os.fdopen(stdout_fd, "r")
        self.returncode: int | None = None
        self.unforked = False  # the server went away before it forked this one: nothing ran
        self._pid = 0
        self._pidfd = -1
        self._started = threading.Event()
        self._done = threading.Event()

    @property
    def pid(self) -> int:
        self._started.wait()
        return self._pid

    def _start(self, pid: int, pidfd: int) -> None:
        self._pid, self._pidfd = pid, pidfd
        self._started.set()

    def _end(self, code: int) -> None:
        if not self._done.is_set():
            self.returncode = code
            self._started.set()
            self._done.set()
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._started.wait(START):  # never forked: there is nothing to signal (the server's loss ends it)
            return
        try:
            if not self._done.is_set() and self._pidfd >= 0:
                signal.pidfd_send_signal(self._pidfd, sig)
        except (ProcessLookupError, OSError):
            pass  # it has exited; its status is on its way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """This side of the server: requests go out on a socket, replies and exit statuses come back on it and
    are read by one thread."""

    def __init__(self):
        from meshrl.lifeline import child_env

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.forkserver", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=child_env(),
            start_new_session=True,  # Ctrl-C reaches the orchestrator alone, as with its services
        )
        theirs.close()
        self.ids = itertools.count()
        self.waiting: dict[int, Forked] = {}  # asked for, not yet forked
        self.children: dict[int, Forked] = {}  # by pid, until they exit
        self.send_lock = threading.Lock()
        self.gone = threading.Event()
        self.settled = threading.Event()  # gone, and every child's end recorded
        threading.Thread(target=self._read, name="meshrl-forkserver", daemon=True).start()

    def spawn(self, argv: list[str], env: dict[str, str]) -> Forked:
        """Fork `meshrl <argv>` with this environment; returns at once (the fork happens once the server has
        imported its modules). OSError when the server is gone."""
        if self.gone.is_set():
            raise OSError("the fork server has exited")
        read, write = os.pipe()
        child = Forked(["meshrl", *argv], read)
        with self.send_lock:
            number = next(self.ids)
            self.waiting[number] = child
            try:
                send(self.sock, {"id": number, "argv": argv, "env": env}, write)
            except OSError:
                del self.waiting[number]
                child.stdout.close()
                raise
            finally:
                os.close(write)
        return child

    def _read(self) -> None:
        try:
            while True:
                message, fd = receive(self.sock)
                if message is None:
                    break
                if "forked" in message:
                    child = self.waiting.pop(message["forked"])
                    self.children[message["pid"]] = child
                    child._start(message["pid"], fd if fd is not None else -1)
                elif "failed" in message:
                    print(
                        f"meshrl: the fork server could not start {message['argv']}: {message['error']}",
                        file=sys.stderr,
                    )
                    self.waiting.pop(message["failed"])._end(1)
                elif "exited" in message and message["exited"] in self.children:
                    self.children.pop(message["exited"])._end(message["code"])
        except OSError:
            pass
        finally:
            self.gone.set()
            self._orphans()
            self.settled.set()

    def _orphans(self) -> None:
        """The server died: its children got SIGTERM from the kernel (meshrl.lifeline); wait for each to
        exit, through its pidfd. Their statuses went with the server: -SIGTERM is what they were sent."""
        for child in list(self.waiting.values()):
            child.unforked = True
            child._end(1)
        deadline = time.monotonic() + START
        for child in list(self.children.values()):
            if child._pidfd >= 0:  # readable once it exits; one that ignores SIGTERM is not waited for past START
                select.select([child._pidfd], [], [], max(0.0, deadline - time.monotonic()))
            child._end(-signal.SIGTERM)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread; close() alone would not
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(5)  # it exits at once when the socket closes (cli/forkserver.py)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def kill(self) -> None:
        """SIGKILL to the server, waiting for nothing; its children get SIGTERM from the kernel (lifeline)."""
        self.proc.kill()
