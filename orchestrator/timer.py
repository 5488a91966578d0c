"""The step's clock: timing_s/<phase> seconds, as verl names them, each phase also a span of the step's trace.

    t = Timer()
    with t("gen"):
        ...
    metrics.update(t)   # {"timing_s/gen": 1.2, ...}

Every room of a step (sampling, the loops) times its phases with it, so it sits below them all.
"""

import contextlib
import time

from meshrl import telemetry


class Timer(dict):
    """timing_s/<phase> seconds, as verl names them; each phase is also a span of the step's trace."""

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        with telemetry.span(phase):
            yield
        self[f"timing_s/{phase}"] = self.get(f"timing_s/{phase}", 0.0) + time.perf_counter() - start
