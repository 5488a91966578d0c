"""A pool of scoring worker processes with a per-sample timeout and crash isolation.

Each worker is a subprocess (services.reward.worker) holding the loaded function.
Samples go out in chunks; workers answer per sample, so when one hangs past
the timeout the pool knows which: it kills that worker (and its process group),
marks the sample timed out, re-queues the rest of the chunk and starts a new
worker. A worker that dies (segfault, os._exit, out of memory) is handled the
same way. The service never hangs and never crashes because of a function.
"""

import collections
import dataclasses
import logging
import selectors
import threading
import time
from typing import Any, cast

from meshrl.pipes import Child, read_frame, write_frame
from services.reward.functions import Args

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Outcome:
    """What scoring one sample gave: a score and extras, or an error."""

    score: float | None = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False


class Worker(Child):
    def __init__(self, spec: str, batched: bool):
        super().__init__("services.reward.worker", [spec, "1" if batched else "0"])
        self.ready = False
        self.job: list[int] | None = None  # sample indices of the chunk in hand
        self.done = 0  # of job
        self.deadline = 0.0


class WorkerPool:
    def __init__(self, spec: str, num_workers: int, timeout: float, batched: bool = False, chunk_size: int = 32):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.spec, self.batched, self.timeout, self.chunk_size = spec, batched, timeout, chunk_size
        self.none_ok = False  # the function may answer None, "no score" (TRL's form); known once started
        self.num_workers = num_workers
        self.workers: list[Worker] = []
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()  # one batch at a time; it keeps every worker busy

    def start(self, timeout: float = 120.0) -> "WorkerPool":
        """Start the workers and wait until each has loaded the function (ValueError if it cannot)."""
        for _ in range(self.num_workers):
            self._spawn()
        deadline = time.monotonic() + timeout
        while not all(w.ready for w in self.workers):
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"reward workers did not load {self.spec!r} within {timeout:.0f}s")
            for key, _ in self.sel.select(timeout=1.0):
                self._on_message(key.data, [])
        return self

    def score(self, samples: list[Args]) -> list[Outcome]:
        with self.lock:
            try:
                return self._score(samples)
            finally:  # after an error, no worker may keep a half-done chunk into the next call
                for w in [w for w in self.workers if w.job is not None]:
                    self._respawn(w)

    def close(self) -> None:
        for w in self.workers:
            self.sel.unregister(w.res_r)
            w.kill()
        self.workers.clear()

    # ---- internals ----------------------------------------------------------------

    def _spawn(self) -> Worker:
        w = Worker(self.spec, self.batched)
        self.workers.append(w)
        self.sel.register(w.res_r, selectors.EVENT_READ, w)
        return w

    def _respawn(self, w: Worker) -> int | None:
        """Kill w, start a worker in its place; returns w's exit code."""
        self.sel.unregister(w.res_r)
        self.workers.remove(w)
        code = w.kill()
        self._spawn()
        return code

    def _replace(self, w: Worker, outcomes: list, error: str, timed_out: bool) -> None:
        """w failed on its current sample (the whole chunk when batched); re-queue the rest."""
        job = w.job
        assert job is not None  # it failed on the chunk in hand
        code = self._respawn(w)
        failed = job[w.done :] if self.batched else job[w.done : w.done + 1]
        if not timed_out:
            error = f"{error} (exit code {code})"
        for i in failed:
            outcomes[i] = Outcome(error=error, timed_out=timed_out)
        rest = job[w.done + len(failed) :]
        if rest:
            self._queue.appendleft(rest)
        log.warning("reward worker %s: %s; started a new one", w.proc.pid, error)

    def _score(self, samples: list[Args]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(samples)
        if self.batched:  # a batched function wants big batches: one chunk per worker
            per_chunk = max(1, -(-len(samples) // self.num_workers))
        else:  # small chunks balance the load and bound what a crash re-queues
            per_chunk = max(1, min(self.chunk_size, -(-len(samples) // (self.num_workers * 4))))
        self._queue = collections.deque(
            list(range(i, min(i + per_chunk, len(samples)))) for i in range(0, len(samples), per_chunk)
        )
        self._samples = samples
        while self._queue or any(w.job for w in self.workers):
            for w in self.workers:
                if w.ready and w.job is None and self._queue:
                    self._send(w, self._queue.popleft(), outcomes)
            busy = [w for w in self.workers if w.job is not None]
            wait = min((w.deadline for w in busy), default=time.monotonic() + 1.0) - time.monotonic()
            for key, _ in self.sel.select(timeout=max(0.0, wait)):
                if key.data in self.workers:
                    self._on_message(key.data, outcomes)
            now = time.monotonic()
            for w in [w for w in self.workers if w.job is not None and now > w.deadline]:
                self._replace(w, outcomes, f"timed out after {self.timeout:g}s", timed_out=True)
        return cast(list[Outcome], outcomes)  # every sample has its outcome once no chunk is left

    def _send(self, w: Worker, job: list[int], outcomes: list) -> None:
        w.job, w.done = job, 0
        w.deadline = time.monotonic() + self.timeout * (len(job) if self.batched else 1)
        try:
            write_frame(w.task_w, {"id": 0, "samples": [list(self._samples[i]) for i in job]})
        except BrokenPipeError:
            self._replace(w, outcomes, "worker process died", timed_out=False)

    def _on_message(self, w: Worker, outcomes: list) -> None:
        msg = read_frame(w.res_r)
        if msg is None:  # the worker is gone
            if not w.ready:
                code = w.proc.wait()
                raise RuntimeError(f"reward worker for {self.spec!r} exited during start (exit code {code})")
            if w.job is None:
                self._respawn(w)
            else:
                self._replace(w, outcomes, "worker process died while scoring", timed_out=False)
            return
        if "ready" in msg:
            if not msg["ready"]:
                self.close()
                raise ValueError(f"could not load reward function {self.spec!r}: {msg['error']}")
            w.ready = True
            # what the worker found loading the function: a TRL-form one is batched whatever was said, and
            # may score a sample None
            self.batched, self.none_ok = msg.get("batched", self.batched), msg.get("none_ok", False)
            return
        results = msg["results"] if self.batched else [msg]
        job = w.job
        assert job is not None  # results come for the chunk in hand
        for r in results:
            i = job[w.done]
            outcomes[i] = Outcome(score=r.get("score"), extras=r.get("extras") or {}, error=r.get("error"))
            w.done += 1
        w.deadline = time.monotonic() + self.timeout
        if w.done == len(job):
            w.job = None
