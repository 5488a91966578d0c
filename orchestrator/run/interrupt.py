"""Ctrl-C and the way out of a run: said at once, bounded in time, never a hang.

    with Interrupts(label, hint, kill) as stop:
        ... the run ...          # the first Ctrl-C raises KeyboardInterrupt here
        finally: stop.arm(); ... # the way out (services stopped in order) has DEADLINE seconds

The first SIGINT prints "stopping ..." at once and raises KeyboardInterrupt in the main thread, so the
loop unwinds, the curves so far are written and the services stop in order. A second SIGINT, or a way
out that takes longer than the deadline (a gRPC channel close that deadlocks after an interrupted call,
grpc/grpc#19973; a process that ignores SIGTERM), stops at once: every service this run started is
killed, the threads' stacks are printed (past the deadline: it is a bug worth a report) and the process
exits 130 (or 1) with the resume hint. Nothing that runs after `arm()` can keep the process alive longer.
"""

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

DEADLINE = 60.0  # seconds for the way out; stopping services takes 1-4 s idle, 12-24 s on a loaded machine


class Interrupts:
    """SIGINT's handler for the length of a run (main thread only; elsewhere the default stays)."""

    def __init__(self, label: str, hint: Callable[[], str], kill: Callable[[], None], deadline: float = DEADLINE):
        self.label = label  # "meshrl grpo": what the lines start with
        self.hint = hint  # where to resume from, read when it is printed
        self.kill = kill  # kills what the run started, without waiting for anything
        self.deadline = deadline
        self.interrupted = False
        self._previous: Any = None  # the handler to restore
        self._timer: threading.Timer | None = None

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, _signum, _frame) -> None:
        if self.interrupted:  # the second Ctrl-C: the user will not wait
            self.now("stopped at once on a second Ctrl-C")
        self.interrupted = True
        print(f"\n{self.label}: interrupted: stopping the services (Ctrl-C again to stop at once)", file=sys.stderr)
        sys.stderr.flush()
        self.arm()
        raise KeyboardInterrupt

    def arm(self) -> None:
        """From here on the process is gone within the deadline (once armed, later calls change nothing)."""
        if self._timer is None:
            self._timer = threading.Timer(self.deadline, self._expired)
            self._timer.daemon = True
            self._timer.start()

    def _expired(self) -> None:
        print(f"{self.label}: stopping took over {self.deadline:.0f} s; where each thread was:", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        self.now(f"stopped after {self.deadline:.0f} s")

    def now(self, why: str) -> None:
        """Kill what the run started and exit without waiting for anything (os._exit: no thread can hold it)."""
        try:
            self.kill()
        finally:
            what = "interrupted by the user" if self.interrupted else "the run ended"
            print(f"{self.label}: {what} ({why}); {self.hint()}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(130 if self.interrupted else 1)
