"""A pool of scoring worker processes with a per-sample timeout and crash isolation.

Each worker is a subprocess (services.reward.worker, a meshrl.pipes Worker) holding the loaded function.
Samples go out in chunks, one chunk in flight per worker; a worker answers per sample, so when one hangs
past the timeout the pool knows which: it stops that worker (and its process group), marks the sample
timed out, puts the rest of the chunk back and starts a new worker. A worker that dies (segfault,
os._exit, out of memory) is handled the same way. The service never hangs and never crashes because of
a function.
"""

import concurrent.futures
import dataclasses
import logging
import queue
import threading
from typing import Any

from meshrl.pipes import Child, Lost, Worker, start_ready
from services.reward.functions import Args

log = logging.getLogger(__name__)
START_TIMEOUT = 120.0  # seconds a worker may take to load the function


@dataclasses.dataclass
class Outcome:
    """What scoring one sample gave: a score and extras, or an error."""

    score: float | None = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False


class WorkerPool:
    def __init__(self, spec: str, num_workers: int, timeout: float, batched: bool = False, chunk_size: int = 32):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.spec, self.batched, self.timeout, self.chunk_size = spec, batched, timeout, chunk_size
        self.none_ok = False  # the function may answer None, "no score" (TRL's form); known once started
        self.num_workers = num_workers
        self.workers: list[Worker | None] = []
        self.threads = concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="meshrl-reward")
        self.lock = threading.Lock()  # one batch at a time; it keeps every worker busy

    def start(self, timeout: float = START_TIMEOUT) -> "WorkerPool":
        """Start the workers and wait until each has loaded the function (ValueError if it cannot)."""
        try:
            workers, said = self._start(self.num_workers, timeout)
        except BaseException:
            self.close()
            raise
        self.workers = list(workers)
        # what the worker found loading the function: a TRL-form one is batched whatever was said, and may
        # score a sample None
        self.batched, self.none_ok = said.get("batched", self.batched), said.get("none_ok", False)
        return self

    def score(self, samples: list[Args]) -> list[Outcome]:
        with self.lock:
            outcomes: list[Outcome] = [Outcome()] * len(samples)
            if self.batched:  # a batched function wants big batches: one chunk per worker
                per_chunk = max(1, -(-len(samples) // self.num_workers))
            else:  # small chunks balance the load and bound what a stuck worker holds back
                per_chunk = max(1, min(self.chunk_size, -(-len(samples) // (self.num_workers * 4))))
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            for i in range(0, len(samples), per_chunk):
                jobs.put(list(range(i, min(i + per_chunk, len(samples)))))
            done = [
                self.threads.submit(self._drain, slot, jobs, samples, outcomes) for slot in range(len(self.workers))
            ]
            for future in done:
                future.result()
            return outcomes

    def close(self) -> None:
        for w in self.workers:
            if w is not None:
                w.stop("the pool is closing")
                w.discard()
        self.workers = []
        self.threads.shutdown(wait=False)

    # ---- internals ----------------------------------------------------------------

    def _start(self, n: int, timeout: float = START_TIMEOUT) -> tuple[list[Worker], dict]:
        """n workers that have loaded the function, started side by side, and what the first said."""
        args = [self.spec, "1" if self.batched else "0"]
        try:
            return start_ready(lambda: Worker(Child("services.reward.worker", args), "worker process"), n, timeout)
        except ValueError as e:
            raise ValueError(f"could not load reward function {self.spec!r}: {e}") from None
        except RuntimeError as e:
            raise RuntimeError(f"reward worker for {self.spec!r}: {e}") from None

    def _worker(self, slot: int) -> Worker:
        """The slot's worker, started again if it was stopped or died."""
        w = self.workers[slot]
        if w is None or w.lost:
            self.workers[slot] = None
            w = self._start(1)[0][0]
            self.workers[slot] = w
        return w

    def _drain(self, slot: int, jobs: queue.SimpleQueue, samples: list[Args], outcomes: list[Outcome]) -> None:
        """Score chunks on one worker until none is left; a chunk's rest goes back when it fails."""
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            w = self._worker(slot)
            args = [list(samples[i]) for i in job]
            answered = 0
            try:
                call = w.call({"batch": args} if self.batched else {"samples": args})
                if self.batched:
                    results = call.reply(self.timeout * len(job))["results"]
                    answered = self._record(job, results, outcomes)
                while answered < len(job):
                    answered += self._record(job[answered:], [call.reply(self.timeout)], outcomes)
            except (TimeoutError, Lost) as e:
                self._failed(w, job[answered:], outcomes, jobs, e)

    def _record(self, job: list[int], results: list[dict], outcomes: list[Outcome]) -> int:
        for i, r in zip(job, results):
            outcomes[i] = Outcome(score=r.get("score"), extras=r.get("extras") or {}, error=r.get("error"))
        return len(results)

    def _failed(self, w: Worker, left: list[int], outcomes: list, jobs: queue.SimpleQueue, e: Exception) -> None:
        """w failed on left[0] (the whole chunk when batched): that fails, the rest goes back."""
        timed_out = isinstance(e, TimeoutError)
        w.stop(f"timed out after {self.timeout:g}s" if timed_out else str(e))
        failed = left if self.batched else left[:1]
        if timed_out:
            error = f"timed out after {self.timeout:g}s"
        else:
            error = f"worker process died while scoring (exit code {w.child.proc.wait()})"
        for i in failed:
            outcomes[i] = Outcome(error=error, timed_out=timed_out)
        if left[len(failed) :]:
            jobs.put(left[len(failed) :])
        log.warning("reward worker %s: %s; starting a new one", w.child.proc.pid, error)
