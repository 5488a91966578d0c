"""Worker processes that run user code a service may have to stop: how they start, how calls reach
them and come back, and how they are stopped (the parent's half; meshrl/worker_main.py is the child's).

A Child is `python -m MODULE ARGS... READ_FD WRITE_FD` in its own process group (a kill takes whatever
the user's code started too), fed requests on one pipe and answering on another. A Worker is a Child
that answers calls by id: `ready` waits for its start handshake, `call` sends a request and returns a
Call whose replies come on the Worker's reader thread, `stop` kills it and fails every call waiting on it
with Lost. The frames are length-prefixed meshrl.v1.Value messages here (JSON-like values, ints kept
apart from floats, bytes allowed: protobuf, never pickle) or JSON (the agent worker's, any interpreter).
The reward service's scoring workers, the env service's environment workers and the run's agent workers
are all Workers.
"""

import itertools
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from meshrl.codec.values import from_value, to_value
from meshrl.v1 import data_pb2 as pb
from meshrl.worker_main import read_bytes, write_bytes

log = logging.getLogger(__name__)
W = TypeVar("W", bound="Worker")


def write_frame(fd: int, value: Any, deadline: float | None = None) -> None:
    """Write one value (meshrl.worker_main.write_bytes says what the deadline does)."""
    write_bytes(fd, to_value(value, "frame").SerializeToString(), deadline)


def read_frame(fd: int) -> Any | None:
    """The next value, or None at end of file (the other side is gone)."""
    body = read_bytes(fd)
    return None if body is None else from_value(pb.Value.FromString(body), "frame")


class Child:
    """A worker process: requests go to task_w, replies come from res_r (both frames). `command`: what
    runs it instead of this interpreter's `-m module` (an agent's own Python and a script's path)."""

    def __init__(
        self, module: str, args: list[str], env: dict[str, str] | None = None, command: list[str] | None = None
    ):
        task_r, self.task_w = os.pipe()
        self.res_r, res_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [*(command or [sys.executable, "-m", module]), *args, str(task_r), str(res_w)],
                pass_fds=(task_r, res_w),
                start_new_session=True,
                env=env,
            )  # own group: see kill
        except OSError:
            for fd in (self.task_w, self.res_r):
                os.close(fd)
            raise
        finally:
            os.close(task_r)
            os.close(res_w)

    def signal_kill(self) -> None:
        """SIGKILL to the process and everything it started; safe from any thread, any number of times."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill(self) -> int | None:
        """Kill it, close the pipes, and return its exit code (call once, when no thread reads res_r)."""
        self.signal_kill()
        for fd in (self.task_w, self.res_r):
            os.close(fd)
        return self.proc.wait()


class Lost(Exception):
    """The worker a call went to is gone (stopped or died); the message says why."""


class Call:
    """A request in flight: its replies, in order, as the worker sends them."""

    def __init__(self):
        self.replies: queue.SimpleQueue = queue.SimpleQueue()

    def reply(self, timeout: float | None) -> dict:
        """The next reply; TimeoutError if none comes within timeout seconds, Lost if the worker goes."""
        try:
            got = self.replies.get(timeout=None if timeout is None else max(0.0, timeout))
        except queue.Empty:
            raise TimeoutError from None
        if isinstance(got, Lost):
            raise got
        return got


class Worker:
    """A started Child that answers calls by id (meshrl/worker_main.py's protocol). `what` names it in
    errors; on_exit(worker) is called once its process is gone, from its reader thread."""

    def __init__(self, child: Child, what: str, frames=(read_frame, write_frame), on_exit=None):
        self.child, self.what, self.on_exit = child, what, on_exit
        self.read, self.write = frames
        self.pending: dict[int, Call] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()  # pending and lost
        self.send_lock = threading.Lock()  # one frame at a time on the pipe
        self.lost = ""  # why it is gone
        self.stopped = False  # by its owner (not died on its own)
        self.closed = False  # its pipes are closed (under send_lock)
        self.reading = False  # its reader thread owns the pipes

    def ready(self, deadline: float) -> dict:
        """Its ready frame once it has loaded what it runs; ValueError with its reason if it could not,
        RuntimeError if it did not start. Then its replies are read on a thread of their own."""
        res_r = self.child.res_r
        if not select.select([res_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise RuntimeError(f"{self.what} did not start in time")
        msg = self.read(res_r)
        if msg is None:
            raise RuntimeError(f"{self.what} exited while starting (exit code {self.child.proc.wait()})")
        if not msg["ready"]:
            raise ValueError(msg["error"])
        os.set_blocking(self.child.task_w, False)  # a wedged worker must not block a sender past its deadline
        self.reading = True
        threading.Thread(target=self._read, name=f"meshrl-worker-{self.child.proc.pid}", daemon=True).start()
        return msg

    def discard(self) -> None:
        """Kill a worker whose start failed (its pipes are not yet its reader's)."""
        if not self.reading and not self.closed:
            self.closed = True
            self.child.kill()

    def call(self, request: dict, deadline: float | None = None) -> Call:
        """Send request; its replies come to the Call. TimeoutError if the pipe takes it not by deadline,
        Lost if the worker is gone."""
        call = Call()
        with self.lock:
            if self.lost:
                raise Lost(self.lost)
            call_id = next(self.ids)
            self.pending[call_id] = call
        try:
            self.tell({**request, "id": call_id}, deadline)
        except BaseException:
            with self.lock:
                self.pending.pop(call_id, None)
            raise
        return call

    def tell(self, request: dict, deadline: float | None = None) -> None:
        """Send a request that gets no reply (a close, a shutdown)."""
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self.send_lock.acquire(timeout=wait):
            raise TimeoutError(f"{self.what}'s pipe is taken")
        try:
            if self.closed:
                raise Lost(self.lost or f"{self.what} died")
            self.write(self.child.task_w, request, deadline)
        except (BrokenPipeError, ConnectionError):
            raise Lost(self.lost or f"{self.what} died") from None
        finally:
            self.send_lock.release()

    @property
    def load(self) -> int:
        """Calls in flight on it."""
        return len(self.pending)

    def stop(self, why: str) -> None:
        """Kill it now: every call waiting on it ends with Lost(why); its reader closes the pipes."""
        self.stopped = True
        self._fail(why)
        self.child.signal_kill()

    def shutdown(self, deadline: float, why: str) -> None:
        """Ask it to stop ({"op": "shutdown"}); killed if it cannot take the request."""
        self._fail(why)
        try:
            self.tell({"op": "shutdown"}, deadline)
        except (TimeoutError, Lost):
            self.child.signal_kill()

    def join(self, deadline: float) -> None:
        """Wait until it is gone, up to deadline; then kill it."""
        try:
            self.child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.child.signal_kill()

    def _read(self) -> None:
        try:
            while (reply := self.read(self.child.res_r)) is not None:
                with self.lock:
                    call = self.pending.get(reply.get("id"))
                    if call is not None and not reply.get("more"):
                        del self.pending[reply["id"]]
                if call is not None and not reply.get("end"):
                    call.replies.put(reply)
        except Exception:  # noqa: BLE001 - a garbled pipe: the worker is no use any more
            log.exception("%s (pid %d) sent something unreadable", self.what, self.child.proc.pid)
            self.child.signal_kill()
        self._fail(f"{self.what} died (exit code {self.child.proc.wait()})")
        with self.send_lock:
            self.closed = True
            os.close(self.child.task_w)
        os.close(self.child.res_r)
        if self.on_exit is not None:
            self.on_exit(self)

    def _fail(self, why: str) -> None:
        """Mark it gone and end every call waiting on it."""
        with self.lock:
            self.lost = self.lost or why
            waiting, self.pending = list(self.pending.values()), {}
        for call in waiting:
            call.replies.put(Lost(self.lost))


def start_ready(make: Callable[[], W], n: int, timeout: float) -> tuple[list[W], dict]:
    """n workers from make(), started side by side and each ready within timeout: (the workers, what the
    first said when ready). If one cannot start, all are stopped and its error raised (Worker.ready's)."""
    workers: list[W] = []
    try:
        for _ in range(n):
            workers.append(make())
        deadline = time.monotonic() + timeout
        said = [w.ready(deadline) for w in workers][0]
    except BaseException:
        for w in workers:
            if w.reading:  # ready before another failed: its reader thread owns its pipes
                w.stop("another worker of its pool could not start")
            w.discard()
        raise
    return workers, said
