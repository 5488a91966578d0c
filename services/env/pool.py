"""Where the env service's environment objects live: worker processes that can be stopped.

Each episode is pinned to one worker (the least loaded when it starts), whose process holds its object
(services/env/worker.py); a call goes to it as a frame and waits at most step_timeout. A call that
overruns stops its worker (SIGKILL to the process group: a thread cannot be stopped, a process can)
and a supervisor thread starts another in its place; the episodes that lived there are lost (ABORTED,
saying so). A worker that dies on its own (a crash, os._exit, out of memory) is replaced the same way.
While no worker runs and none can be started, health is NOT_SERVING; the supervisor keeps trying.
"""

import json
import logging
import threading
import time

from meshrl.config.env import EnvConfig
from meshrl.errors import Aborted, FailedPrecondition, InvalidArgument
from meshrl.lifeline import child_env
from meshrl.pipes import Child, Lost, Worker, start_ready

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # seconds a worker may take to import the environment
RETRY_PAUSES = (0.5, 10.0)  # a failed start is retried after 0.5 s, doubling up to 10 s
CLOSE_WAIT = 2.0  # seconds stopping workers get to close their episodes before they are killed


class ProcessWorker(Worker):
    """An environment worker process (services/env/worker.py) and the episodes pinned to it."""

    def __init__(self, spec: str, threads: int, on_exit):
        # it dies with this process even when a hung call starves its reader (meshrl.lifeline); the kernel
        # ties that to the thread that starts it: the pool's constructor's or its supervisor's, both lasting
        super().__init__(
            Child("services.env.worker", [spec, str(threads)], env=child_env()), "its worker process", on_exit=on_exit
        )
        self.num_episodes = 0  # pinned here (the pool places new ones by it)


class EnvPool:
    def __init__(self, cfg: EnvConfig, on_health=None):
        self.cfg = cfg
        self.size = min(cfg.processes, cfg.workers)
        self.on_health = on_health or (lambda serving: None)
        self.cond = threading.Condition()
        self.closed = False
        self.error: str | None = None  # why the last start failed (cleared by the next that works)
        self.serving = True
        self.replaced = 0  # workers stopped or died while serving
        self.described: dict = {}  # the class's STOP and TOOLS, as its workers report them
        self.workers = self._start(self.size)  # ValueError if the environment cannot be loaded
        threading.Thread(target=self._supervise, name="meshrl-env-supervisor", daemon=True).start()

    # ---- episodes ---------------------------------------------------------------------------

    def assign(self) -> ProcessWorker:
        """The worker a new episode goes to: the one with the fewest (waits for a replacement)."""
        with self.cond:
            self.cond.wait_for(lambda: self._live() or self.closed or self.error, timeout=self.cfg.step_timeout)
            if self.closed:
                raise FailedPrecondition("the environment service is stopping")
            if not self._live():
                raise FailedPrecondition(f"no environment worker is running: {self.error or 'none started in time'}")
            worker = min(self._live(), key=lambda w: w.num_episodes)
            worker.num_episodes += 1
            return worker

    def _live(self) -> list[ProcessWorker]:
        """The workers not stopped (one stopped is in self.workers until its process is reaped)."""
        return [w for w in self.workers if not w.lost]

    def release(self, worker: ProcessWorker) -> None:
        with self.cond:
            worker.num_episodes -= 1

    def call(self, worker: ProcessWorker, request: dict, what: str) -> dict:
        """The worker's reply to request within step_timeout, or the status its failure becomes."""
        timeout = self.cfg.step_timeout
        deadline = time.monotonic() + timeout
        try:
            reply = worker.call(request, deadline).reply(deadline - time.monotonic())
        except TimeoutError:
            self._replace(
                worker, f"its worker was replaced after a hung {what} (one past --step-timeout {timeout:g} s)"
            )
            raise Aborted(
                f"the environment's {what} took longer than --step-timeout {timeout:g} s; the episode "
                "is over (its worker process was stopped and replaced)"
            ) from None
        except Lost as e:
            raise Aborted(f"episode lost: {e}") from None
        if "error" in reply:
            raise (InvalidArgument if reply["error"] == "invalid" else Aborted)(reply["message"])
        return reply

    def notify(self, worker: ProcessWorker, request: dict) -> None:
        """Send a request that gets no reply (a close); a worker that cannot take it is replaced."""
        try:
            worker.tell(request, time.monotonic() + self.cfg.step_timeout)
        except TimeoutError:
            self._replace(worker, "its worker process took no requests for --step-timeout")
        except Lost:
            pass

    # ---- workers ----------------------------------------------------------------------------

    def _start(self, n: int) -> list[ProcessWorker]:
        """n ready workers (started side by side), or the first one's error; what the class describes (its
        STOP and TOOLS, episodes.describe) as they report it."""
        workers, said = start_ready(
            lambda: ProcessWorker(self.cfg.module, self.cfg.workers, self._gone), n, START_TIMEOUT
        )
        self.described = {"stop": said["stop"], "tools": json.loads(said["tools_json"])}
        return workers

    def _replace(self, worker: ProcessWorker, reason: str) -> None:
        """Stop a worker; the supervisor starts another once it is gone."""
        worker.stop(reason)
        with self.cond:
            self.replaced += 1

    def _gone(self, worker: ProcessWorker) -> None:
        with self.cond:
            if worker in self.workers:
                self.workers.remove(worker)
                self.replaced += not (self.closed or worker.stopped)  # stopped ones were counted
                log.warning("environment worker gone: %s; starting another", worker.lost)
            self.cond.notify_all()

    def _supervise(self) -> None:
        """Keep size workers running: start one in place of each that is gone, retrying a failed start."""
        pause = RETRY_PAUSES[0]
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or len(self.workers) < self.size)
                if self.closed:
                    return
            try:
                worker = self._start(1)[0]
            except Exception as e:  # noqa: BLE001 - reported by health and by Reset; tried again
                log.warning("could not start an environment worker (again in %.1f s): %s", pause, e)
                with self.cond:
                    self.error = str(e)
                self._report_health()
                with self.cond:
                    self.cond.wait_for(lambda: self.closed, timeout=pause)
                pause = min(pause * 2, RETRY_PAUSES[1])
                continue
            pause = RETRY_PAUSES[0]
            with self.cond:
                if self.closed:
                    worker.shutdown(time.monotonic(), "the service is stopping")
                    return
                self.workers.append(worker)
                self.error = None
                self.cond.notify_all()
            self._report_health()

    def _report_health(self) -> None:
        """NOT_SERVING while no worker runs and the last start failed; SERVING otherwise."""
        with self.cond:
            serving = bool(self.workers) or self.error is None
            changed, self.serving = serving != self.serving, serving
        if changed:
            self.on_health(serving)

    def close(self) -> None:
        """Stop every worker: each closes its episodes within CLOSE_WAIT, or is killed."""
        with self.cond:
            self.closed = True
            workers, self.workers = list(self.workers), []
            self.cond.notify_all()
        deadline = time.monotonic() + CLOSE_WAIT
        for w in workers:
            w.shutdown(deadline, "the service is stopping")
        for w in workers:
            w.join(deadline)
