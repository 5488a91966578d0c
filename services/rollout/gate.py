"""In-flight weight updates (rollout.on_update=keep): generation pauses between engine steps while an update
loads, then goes on with the same requests and their KV cache, as vLLM's pause_generation(mode="keep")
does; each token remembers the weight version that produced it.

    gate = Gate(version)                   # the servicer's, one per engine
    gate.enter(call)                       # before a Generate's first step
    call.versions ...                      # after each step: the version of the step to come
    gate.leave()                           # when its generation ends, however
    gate.pause(); load ...; gate.resume(v) # an update: waits only for the steps running to end

A call in an engine step counts as running; pause() closes the gate and waits until none runs, so no step
sees part of an update. A call that waits at the closed gate and whose caller goes away (cancelled,
deadline) stops waiting within POLL_S and ends ABORTED, so an update abandoned halfway holds no caller
past its deadline.
"""

import threading
from collections.abc import Callable

POLL_S = 0.1  # how often a call parked at the gate checks that its caller is still there


class Gate:
    def __init__(self, version: int) -> None:
        self.cond = threading.Condition()
        self.closed = False
        self.running = 0  # calls inside an engine step (between two checks)
        self.version = version  # the weights the next step runs with
        self.updates: list[int] = []  # the version each update loaded (in order; a version may come again)

    def enter(self, alive: Callable[[], bool]) -> int | None:
        """Before a call's first step: waits while an update loads; the version its first step runs with,
        or None if its caller went away meanwhile (it is then not running)."""
        with self.cond:
            while self.closed:
                if not alive():
                    return None
                self.cond.wait(POLL_S)
            self.running += 1
            return self.version

    def step(self, alive: Callable[[], bool]) -> int | None:
        """Between two steps of a running call: parks while an update loads, then the version the next
        step runs with (None: the caller went away while parked; it is no longer running)."""
        with self.cond:
            if not self.closed:
                return self.version
            self.running -= 1
            self.cond.notify_all()
        return self.enter(alive)

    def leave(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def pause(self) -> None:
        """Closes the gate and waits for the steps running to end (each call then parks at its next check)."""
        with self.cond:
            self.closed = True
            self.cond.wait_for(lambda: self.running == 0)

    def resume(self, version: int, loaded: bool = True) -> None:
        """Opens the gate on `version`; loaded: an update loaded (one that failed before loading: not)."""
        with self.cond:
            self.closed, self.version = False, version
            if loaded:
                self.updates.append(version)
            self.cond.notify_all()
