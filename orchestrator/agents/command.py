"""rollout.agent_command: an agent in any language, one process per episode (`sh -c COMMAND`), the
runner orchestrator/agents/pool.py's agent_runner returns when the run names a command.

    agent = CommandAgent("node agent.js", timeout=300)
    result, error = agent.play(task, base_url, key)    # the command's last line, as JSON

The command runs in a session of its own, so that at rollout.agent_timeout it is killed with everything
it started. Its output is read in chunks with a deadline and never held whole: of stdout only the last
line (the result), of stderr a tail for the error message. A child that leaves the session (setsid) and
keeps the pipes open cannot be killed with it, so the pipes are closed on it instead: reading never waits
past the timeout. A command that cannot be started (a wrong path, not executable) is the run's error, not
an episode's: ValueError, as for a rollout.agent that cannot be imported.
"""

import contextlib
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from meshrl.lifeline import child_env

CHUNK = 1 << 16  # bytes read or written at a time
TAIL_BYTES = 1 << 16  # of stderr, kept for the error message
LINE_BYTES = 16 << 20  # of stdout's last line (the result) at most; a longer line is cut and not JSON
GRACE_S = 1.0  # after the command exits, for what its leftovers still hold open to be read
POLL_S = 0.25  # without a pidfd: how often to look whether the command exited while its pipes are held
CANNOT_START = (126, 127)  # a shell's exit codes for a program it cannot execute or cannot find


class LastLine:
    """The last non-blank line of a stream fed in chunks, held to `limit` bytes (a longer one keeps its
    head and is marked cut); the stream's other lines are never held."""

    def __init__(self, limit: int = LINE_BYTES):
        self.limit = limit
        self.line, self.cut = b"", False  # the last complete non-blank line
        self.open, self.open_cut = bytearray(), False  # the line still being read
        self.num_bytes = 0

    def feed(self, chunk: bytes) -> None:
        self.num_bytes += len(chunk)
        end = chunk.rfind(b"\n")
        if end < 0:
            self._grow(chunk)
            return
        # of the lines this chunk ends only the last non-blank one counts: found from the end, in C, so
        # that megabytes of short lines cost no Python loop
        done = chunk[:end].rstrip()
        start = done.rfind(b"\n") + 1  # 0: that line began before this chunk (or every line here is blank)
        if start:
            self.open, self.open_cut = bytearray(), False
        self._grow(done[start:])
        self._end_line()
        self._grow(chunk[end + 1 :])

    def _grow(self, data: bytes) -> None:
        room = self.limit - len(self.open)
        self.open += data[:room]
        self.open_cut = self.open_cut or len(data) > room

    def _end_line(self) -> None:
        if self.open.strip():
            self.line, self.cut = bytes(self.open), self.open_cut
        self.open, self.open_cut = bytearray(), False

    def result(self) -> tuple[str, bool]:
        """(the last non-blank line, whether it was cut), the stream ended (a last line without newline counts)."""
        self._end_line()
        return self.line.decode(errors="replace"), self.cut


class Tail:
    """The last `limit` bytes of a stream fed in chunks."""

    def __init__(self, limit: int = TAIL_BYTES):
        self.limit = limit
        self.data = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.data += chunk[-self.limit :]
        del self.data[: -self.limit]

    def last_line(self) -> str:
        lines = self.data.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""


class CommandAgent:
    """rollout.agent_command: `sh -c COMMAND` per episode, with OPENAI_BASE_URL, OPENAI_API_KEY and
    MESHRL_TASK in its environment and the task as JSON on stdin; its result is the last line it prints."""

    def __init__(self, command: str, timeout: float):
        self.command, self.timeout = command, timeout
        self.procs: dict[subprocess.Popen, int] = {}  # each episode's process: its wake pipe's write end
        self.lock = threading.Lock()
        self.started = False  # an episode has ended well: the command can be started

    def scores_groups(self) -> bool:
        return False  # a command scores its own episode; a group's scoring is a Python agent's (pool.py)

    def play(  # limit: an episode's parts
        self, task: dict, base_url: str, key: str, on_start: Callable[[int], None] | None = None, group=None
    ) -> tuple[Any, str]:
        """(the command's result, "") or (None, why the episode is lost). ValueError if it cannot start.
        on_start(pid): its process, once started (the run binds the episode's key to it); group: unused."""
        text = json.dumps(task)
        env = child_env({**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "MESHRL_TASK": text})
        out, err = LastLine(), Tail()
        wake_r, wake_w = os.pipe()  # kill() writes here: the episode ends now, whatever holds its pipes
        try:
            proc = subprocess.Popen(
                ["sh", "-c", self.command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            for fd in (wake_r, wake_w):
                os.close(fd)
            if isinstance(e, (FileNotFoundError, PermissionError)):  # no shell to run it with
                raise ValueError(f"rollout.agent_command={self.command!r} cannot start: {e}") from None
            return None, f"the agent command could not start: {e}"  # e.g. a task over the environment's limit
        if on_start is not None:
            on_start(proc.pid)
        with self.lock:
            self.procs[proc] = wake_w
        state = "failed"
        try:
            state = _exchange(proc, text.encode(), time.monotonic() + self.timeout, out, err, wake_r)
        finally:
            with self.lock:
                del self.procs[proc]
            for fd in (wake_r, wake_w):
                os.close(fd)
            _end(proc, clean=state == "done")
        if state == "stopped":
            return None, "the run is stopping"
        if state == "timeout":
            return None, f"the agent command did not finish within rollout.agent_timeout={self.timeout:g} s"
        return self._result(proc.returncode, out, err)

    def _result(self, code: int, out: LastLine, err: Tail) -> tuple[Any, str]:
        if code in CANNOT_START and not out.num_bytes and not self.started:
            # the shell could not find or execute the program, and no episode has ever run: every one will
            # fail the same way, so the run stops here
            why = err.last_line()[:300] or f"exit code {code}"
            raise ValueError(f"rollout.agent_command={self.command!r} cannot start: {why}")
        if code:
            return None, f"the agent command exited with {code}: {err.last_line()[:300]}"
        line, cut = out.result()
        if cut:
            return None, f"the agent command's last line is over {LINE_BYTES >> 20} MiB: {line[:200]!r}"
        try:
            result = json.loads(line)
        except ValueError:
            return None, f"the agent command's last line is not JSON: {line[:200]!r}"
        self.started = True
        return result, ""

    def close(self) -> None:
        self.kill()

    def kill(self) -> None:
        """Every episode in flight ends now, lost: its command killed, its pipes left."""
        with self.lock:
            for proc, wake in self.procs.items():
                _killpg(proc)
                os.write(wake, b"!")


def _exchange(proc: subprocess.Popen, data: bytes, deadline: float, out: LastLine, err: Tail, wake: int) -> str:
    """Write `data` to the command's stdin while reading its stdout into `out` and its stderr into `err`,
    until: it exited and its pipes closed ("done"), or the deadline passed ("timeout"), or `wake` was
    written ("stopped"). Pipes its leftovers hold open after it exited are read GRACE_S more ("left")."""
    assert proc.stdin and proc.stdout and proc.stderr
    todo = memoryview(data)
    with selectors.DefaultSelector() as sel, _exit_fd(proc) as exit_fd:
        sel.register(wake, selectors.EVENT_READ)
        if exit_fd is not None:
            sel.register(exit_fd, selectors.EVENT_READ)
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, out.feed)
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ, err.feed)
        stdin = proc.stdin.fileno()
        os.set_blocking(stdin, False)  # a write takes what the pipe has room for; the loop does the rest
        sel.register(stdin, selectors.EVENT_WRITE)
        pipes, exited = 3, False
        while proc.poll() is None or pipes:  # poll first: it sets returncode
            now = time.monotonic()
            if proc.returncode is not None and not exited:  # what still holds its pipes is a leftover
                exited, deadline = True, min(deadline, now + GRACE_S)
            if now >= deadline:
                return "left" if exited else "timeout"
            wait = deadline - now if exit_fd is not None else min(deadline - now, POLL_S)
            for selected, _ in sel.select(wait):
                if selected.fd == wake:
                    return "stopped"
                if selected.fd == exit_fd:
                    sel.unregister(exit_fd)  # it exited: poll() sees it
                elif selected.fd == stdin:
                    todo = _write(stdin, todo)
                    if not todo:
                        sel.unregister(stdin)
                        proc.stdin.close()  # end of file: the task is all there
                        pipes -= 1
                elif chunk := os.read(selected.fd, CHUNK):
                    selected.data(chunk)
                else:
                    sel.unregister(selected.fd)
                    pipes -= 1
    return "done"


@contextlib.contextmanager
def _exit_fd(proc: subprocess.Popen) -> Iterator[int | None]:
    """A file descriptor readable once the command exits (Linux's pidfd), so that the loop needs no
    polling; None where there is none (the loop then polls every POLL_S)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _write(fd: int, todo: memoryview) -> memoryview:
    """What is left of `todo` after one write; nothing if the command stopped reading it."""
    try:
        return todo[os.write(fd, todo[:CHUNK]) :]
    except BrokenPipeError:
        return todo[:0]


def _end(proc: subprocess.Popen, clean: bool) -> None:
    """Kill the episode's process group (unless it ended `clean`: exited, its pipes closed), close its
    pipes whoever else holds them, reap the command."""
    if not clean:
        _killpg(proc)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f:
            try:
                f.close()
            except OSError:  # a half-written stdin's flush; nothing of ours is buffered there
                pass
    proc.wait()


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
