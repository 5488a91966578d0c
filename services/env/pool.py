"""Where the env service's environment objects live: worker processes that can be stopped.

Each episode is pinned to one worker (the least loaded when it starts), whose process holds its object
(services/env/worker.py); a call goes to it as a frame and waits at most step_timeout. A call that
overruns stops its worker (SIGKILL to the process group: a thread cannot be stopped, a process can)
and a supervisor thread starts another in its place; the episodes that lived there are lost (ABORTED,
saying so). A worker that dies on its own (a crash, os._exit, out of memory) is replaced the same way.
While no worker runs and none can be started, health is NOT_SERVING; the supervisor keeps trying.

A class handed in by a test (no spec to load in another process) runs in this process instead
(LocalWorker): the same protocol, but a hung call there cannot be stopped.
"""

import concurrent.futures
import itertools
import json
import logging
import os
import select
import threading
import time

from meshrl.config.env import EnvConfig
from meshrl.errors import Aborted, FailedPrecondition, InvalidArgument
from meshrl.lifeline import child_env
from meshrl.pipes import Child, read_frame, write_frame
from services.env.episodes import Episodes, describe

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # seconds a worker may take to import the environment
RETRY_PAUSES = (0.5, 10.0)  # a failed start is retried after 0.5 s, doubling up to 10 s
CLOSE_WAIT = 2.0  # seconds stopping workers get to close their episodes before they are killed


class WorkerLost(Exception):
    """The worker holding an episode is gone; the message says why."""


class Worker:
    """Calls out, replies back by id. Subclasses say how a request travels and how to stop it."""

    def __init__(self, on_exit):
        self.on_exit = on_exit  # called once when the worker is gone (stopped or died)
        self.pending: dict[int, concurrent.futures.Future] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.num_episodes = 0  # pinned here (the pool places new ones by it)
        self.lost: str | None = None  # why it is gone
        self.stopped = False  # by the pool (not died on its own)

    def call(self, request: dict, deadline: float) -> dict:
        """The reply to request; TimeoutError past deadline, WorkerLost if the worker goes."""
        future: concurrent.futures.Future[dict] = concurrent.futures.Future()
        with self.lock:
            if self.lost:
                raise WorkerLost(self.lost)
            call_id = next(self.ids)
            self.pending[call_id] = future
        try:
            self.send({**request, "id": call_id}, deadline)
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            with self.lock:
                self.pending.pop(call_id, None)

    def _deliver(self, reply: dict) -> None:
        with self.lock:
            future = self.pending.pop(reply.pop("id"), None)
        if future is not None:
            future.set_result(reply)

    def _fail(self, reason: str) -> None:
        """Mark the worker gone and end every call waiting on it."""
        with self.lock:
            self.lost = self.lost or reason
            waiting, self.pending = list(self.pending.values()), {}
        for future in waiting:
            future.set_exception(WorkerLost(self.lost))

    # ---- what subclasses say ----------------------------------------------------------------

    def wait_ready(self, deadline: float) -> dict:
        """What its environment class describes (episodes.describe) once it can serve."""
        raise NotImplementedError

    def discard(self) -> None:
        """Drop a worker that never got to serve."""
        raise NotImplementedError

    def stop(self, reason: str) -> None:
        """Stop it now (replaced by the pool); calls waiting on it end with WorkerLost(reason)."""
        raise NotImplementedError

    def shutdown(self, deadline: float) -> None:
        """Ask it to close its episodes and stop (the service is stopping)."""
        raise NotImplementedError

    def join(self, deadline: float) -> None:
        """Wait until it is gone, up to deadline."""
        raise NotImplementedError

    def send(self, request: dict, deadline: float) -> None:
        """Hand it a request; TimeoutError if it cannot take one by deadline, WorkerLost if it is gone."""
        raise NotImplementedError


class ProcessWorker(Worker):
    def __init__(self, spec: str, threads: int, on_exit):
        super().__init__(on_exit)
        # it dies with this process even when a hung call starves its reader (meshrl.lifeline); the kernel
        # ties that to the thread that starts it: the pool's constructor's or its supervisor's, both lasting
        self.child = Child("services.env.worker", [spec, str(threads)], env=child_env())
        self.send_lock = threading.Lock()  # one frame at a time on the pipe
        self.closed = False  # the pipes are closed (under send_lock)

    def wait_ready(self, deadline: float) -> dict:
        """episodes.describe of the class once it has loaded it; ValueError (cannot load) or RuntimeError."""
        if not select.select([self.child.res_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise RuntimeError(f"an environment worker did not start within {START_TIMEOUT:g} s")
        msg = read_frame(self.child.res_r)
        if msg is None:
            raise RuntimeError(f"an environment worker exited while starting (exit code {self.child.proc.wait()})")
        if not msg["ready"]:
            raise ValueError(msg["error"])
        os.set_blocking(self.child.task_w, False)  # a wedged worker must not block a sender past its deadline
        threading.Thread(target=self._read, name=f"meshrl-env-worker-{self.child.proc.pid}", daemon=True).start()
        return {"stop": msg["stop"], "tools": json.loads(msg["tools_json"])}

    def discard(self) -> None:
        """Kill a worker that never got to serve."""
        self.child.kill()

    def stop(self, reason: str) -> None:
        self.stopped = True
        self._fail(reason)
        self.child.signal_kill()  # its reader sees the pipe close and reports it gone

    def shutdown(self, deadline: float) -> None:
        """Ask it to close its episodes and exit (it is killed at join if it has not)."""
        self._fail("the service is stopping")
        try:
            self.send({"op": "shutdown"}, deadline)
        except (TimeoutError, WorkerLost):
            self.child.signal_kill()

    def join(self, deadline: float) -> None:
        try:
            self.child.proc.wait(max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: it had its chance
            self.child.signal_kill()

    def send(self, request: dict, deadline: float) -> None:
        if not self.send_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError("the worker's pipe is taken")
        try:
            if self.closed:
                raise WorkerLost(self.lost or "its worker process died")
            write_frame(self.child.task_w, request, deadline)
        except (BrokenPipeError, ConnectionError):
            raise WorkerLost(self.lost or "its worker process died") from None
        finally:
            self.send_lock.release()

    def _read(self) -> None:
        try:
            while (reply := read_frame(self.child.res_r)) is not None:
                self._deliver(reply)
        except Exception:  # noqa: BLE001 - a garbled pipe: the worker is no use any more
            log.exception("environment worker %s sent something unreadable", self.child.proc.pid)
            self.child.signal_kill()
        code = self.child.proc.wait()
        self._fail(f"its worker process died (exit code {code})")
        with self.send_lock:
            self.closed = True
            os.close(self.child.task_w)
        os.close(self.child.res_r)
        self.on_exit(self)


class LocalWorker(Worker):
    """Episodes of a class object, on this process's threads (tests hand the servicer classes)."""

    def __init__(self, factory, threads: int, on_exit):
        super().__init__(on_exit)
        self.factory, self.here = factory, Episodes(factory)
        self.threads = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="meshrl-env")

    def wait_ready(self, deadline: float) -> dict:
        return describe(self.factory)

    def discard(self) -> None:
        self.threads.shutdown(wait=False)

    def stop(self, reason: str) -> None:
        self.stopped = True
        self._fail(reason)
        self.threads.shutdown(wait=False, cancel_futures=True)  # a hung call's thread runs on, unheard
        self.on_exit(self)

    def shutdown(self, deadline: float) -> None:
        self._fail("the service is stopping")
        self.here.close_all()
        self.threads.shutdown(wait=False, cancel_futures=True)

    def join(self, deadline: float) -> None:
        pass

    def send(self, request: dict, deadline: float) -> None:
        def answer():
            reply = self.here.handle(request)
            if request.get("id"):
                self._deliver({"id": request["id"], **reply})

        try:
            self.threads.submit(answer)
        except RuntimeError:  # shut down: stopped
            raise WorkerLost(self.lost or "its worker was stopped") from None


class EnvPool:
    def __init__(self, cfg: EnvConfig, factory=None, on_health=None):
        self.cfg, self.factory = cfg, factory
        self.size = 1 if factory is not None else min(cfg.processes, cfg.workers)
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

    def assign(self) -> Worker:
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

    def _live(self) -> list[Worker]:
        """The workers not stopped (one stopped is in self.workers until its process is reaped)."""
        return [w for w in self.workers if not w.lost]

    def release(self, worker: Worker) -> None:
        with self.cond:
            worker.num_episodes -= 1

    def call(self, worker: Worker, request: dict, what: str) -> dict:
        """The worker's reply to request within step_timeout, or the status its failure becomes."""
        timeout = self.cfg.step_timeout
        try:
            reply = worker.call(request, time.monotonic() + timeout)
        except TimeoutError:
            self._replace(
                worker, f"its worker was replaced after a hung {what} (one past --step-timeout {timeout:g} s)"
            )
            raise Aborted(
                f"the environment's {what} took longer than --step-timeout {timeout:g} s; the episode "
                "is over (its worker process was stopped and replaced)"
            ) from None
        except WorkerLost as e:
            raise Aborted(f"episode lost: {e}") from None
        if "error" in reply:
            raise (InvalidArgument if reply["error"] == "invalid" else Aborted)(reply["message"])
        return reply

    def notify(self, worker: Worker, request: dict) -> None:
        """Send a request that gets no reply (a close); a worker that cannot take it is replaced."""
        try:
            worker.send(request, time.monotonic() + self.cfg.step_timeout)
        except TimeoutError:
            self._replace(worker, "its worker process took no requests for --step-timeout")
        except WorkerLost:
            pass

    # ---- workers ----------------------------------------------------------------------------

    def _start(self, n: int) -> list[Worker]:
        """n ready workers (started side by side), or the first one's error."""
        workers: list[Worker]
        if self.factory is not None:
            workers = [LocalWorker(self.factory, self.cfg.workers, self._gone) for _ in range(n)]
        else:
            workers = [ProcessWorker(self.cfg.module, self.cfg.workers, self._gone) for _ in range(n)]
        deadline = time.monotonic() + START_TIMEOUT
        try:
            self.described = [w.wait_ready(deadline) for w in workers][0]
        except BaseException:
            for w in workers:
                w.discard()
            raise
        return workers

    def _replace(self, worker: Worker, reason: str) -> None:
        """Stop a worker; the supervisor starts another once it is gone."""
        worker.stop(reason)
        with self.cond:
            self.replaced += 1

    def _gone(self, worker: Worker) -> None:
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
                    worker.shutdown(time.monotonic())
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
            w.shutdown(deadline)
        for w in workers:
            w.join(deadline)
