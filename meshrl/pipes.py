"""Child processes that run user code a service may have to stop, and the frames they talk in.

A Child is `python -m MODULE ARGS... READ_FD WRITE_FD` in its own process group (a kill takes whatever
the user's code started too), fed requests on one pipe and answering on another. Frames are
length-prefixed meshrl.v1.Value messages: JSON-like values (ints kept apart from floats, bytes
allowed) as protobuf, never pickle. The reward service's scoring workers (services/reward/pool.py) and
the env service's environment workers (services/env/pool.py) are Children.
"""

import os
import select
import signal
import struct
import subprocess
import sys
import time
from typing import Any

from meshrl.codec.values import from_value, to_value
from meshrl.v1 import data_pb2 as pb

_HEADER = struct.Struct("<I")


def write_frame(fd: int, value: Any, deadline: float | None = None) -> None:
    """Write one value. With a deadline (time.monotonic()) fd must be non-blocking: TimeoutError if the
    reader has not taken it all by then (a frame cut short leaves the pipe unusable: stop the reader)."""
    body = to_value(value, "frame").SerializeToString()
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        if deadline is not None and not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            raise TimeoutError("the reading process took nothing from its pipe in time")
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any | None:
    """The next value, or None at end of file (the other side is gone)."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(fd, _HEADER.unpack(header)[0])
    if body is None:
        return None
    return from_value(pb.Value.FromString(body), "frame")


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
