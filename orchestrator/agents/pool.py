"""Where agents run: a pool of worker processes for a Python agent (rollout.agent=FILE.py:function), each
playing several episodes at once on threads, or a process per episode for a command in any language
(rollout.agent_command, orchestrator/agents/command.py). The workers run in meshrl's interpreter or in
the one rollout.agent_python names (an agent framework's own venv: interpreter.py), which is checked
before the first worker starts.

    pool = agent_runner(cfg.rollout)           # AgentPool or CommandAgent
    result, error = pool.play(task, base_url, key)
    pool.close()

An episode that overruns rollout.agent_timeout stops its worker with everything it started (its own
process group: a thread cannot be stopped, a process can), which loses the episodes in flight there too,
as the environment service's workers do; the next episode starts a fresh worker. An exception or a
result that is not JSON loses that episode only, a crash that worker's episodes, each with `error`
saying why. Workers start when the first episode needs them and serve the run's every step; one that
died is started again for the next episode.
"""

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from meshrl.pipes import Lost, Worker, start_ready
from meshrl.worker_main import read_json, write_json
from orchestrator.agents.command import CommandAgent
from orchestrator.agents.interpreter import Process, check_python

log = logging.getLogger(__name__)
START_TIMEOUT = 120.0  # seconds a worker may take to import the agent


def start_worker(spec: str, threads: int, python: str = "") -> tuple[Worker, dict]:
    """A worker process that has loaded the agent, and its ready frame; ValueError naming rollout.agent if
    it cannot."""

    def make() -> Worker:
        process = Process(python, [spec, str(threads)])
        return Worker(process, "the agent's worker process", frames=(read_json, write_json))

    try:
        workers, said = start_ready(make, 1, START_TIMEOUT)
        return workers[0], said
    except ValueError as e:
        raise ValueError(f"rollout.agent={spec}: {e}") from None


class AgentPool:
    """`workers` processes playing up to workers x threads episodes at once, on threads. Where the agent's
    module defines score_group, a group's episodes all play on one worker (group mod workers), which then
    scores them together: what it kept of each is in its memory."""

    def __init__(self, spec: str, workers: int, threads: int, timeout: float, *, python: str = ""):
        self.spec, self.threads, self.timeout, self.python = spec, threads, timeout, python
        self.checked = not python  # meshrl's own interpreter needs no check
        self.slots: list[Worker | None] = [None] * workers
        # episodes sent at once are at most the workers' threads, so that an episode's clock starts when
        # it starts (validation and sampling ahead may play at the same time); each worker may run them
        # all, as a group's episodes go to one worker
        self.room = threading.Semaphore(workers * threads)
        self.lock = threading.Lock()
        self.closed = False
        self.groups: bool | None = None  # whether the agent's module scores groups (its ready frame says)

    def _worker(self, group: int | None = None) -> Worker:
        """The least loaded live worker (with a group that scores groups: its own), started (or started
        again) where a slot has none."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the agent pool is closed")
            if not self.checked:
                check_python(self.python)
                self.checked = True
            for i, w in enumerate(self.slots):
                if w is None or w.lost:
                    w, said = start_worker(self.spec, self.threads * len(self.slots), self.python)
                    self.slots[i], self.groups = w, bool(said.get("score_group"))
            if group is not None and self.groups:
                return self.slots[group % len(self.slots)]  # type: ignore[return-value]
            return min((w for w in self.slots if w is not None), key=lambda w: w.load)

    def scores_groups(self) -> bool:
        """Whether the agent's module defines score_group (a worker started to learn it)."""
        if self.groups is None:
            self._worker()
        return bool(self.groups)

    def play(  # limit: an episode's parts
        self, task: dict, base_url: str, key: str, on_start: Callable[[int], None] | None = None, group=None
    ) -> tuple[Any, str]:
        """(the agent's result, "") or (None, why the episode is lost). ValueError if the agent cannot load.
        on_start(pid): the worker process that plays it (the run binds the episode's key to it); group: the
        episode's group in the step (its prompt's), which score_group scores together."""
        with self.room:
            worker = self._worker(group)
            if on_start is not None:
                on_start(worker.child.proc.pid)
            return self._call(worker, {"task_json": json.dumps(task), "base_url": base_url, "api_key": key})

    def score_group(self, group: int, keys: list[str], tasks: list[dict], results: list) -> tuple[Any, str]:
        """The module's score_group(keys, tasks, results) on the worker that played the group: (its answer,
        "") or (None, why the group is lost); results[i] None where episode i was lost."""
        request = {"op": "score_group", "keys": keys, "tasks_json": json.dumps(tasks)}
        return self._call(self._worker(group), {**request, "results_json": json.dumps(results)})

    def _call(self, worker: Worker, request: dict) -> tuple[Any, str]:
        try:
            call = worker.call(request)
            reply = call.reply(self.timeout)
        except TimeoutError:
            why = f"the agent did not finish within rollout.agent_timeout={self.timeout:g} s"
            worker.stop(f"lost with its worker, stopped because another episode on it ran past {self.timeout:g} s")
            return None, why
        except Lost as e:
            return None, str(e)
        if not reply["ok"]:
            log.debug("an agent failed: %s\n%s", reply["error"], reply.get("where", ""))
            return None, f"the agent raised {reply['error']}"
        return json.loads(reply["result_json"]), ""

    def close(self) -> None:
        """Stop every worker (episodes still in flight are lost)."""
        with self.lock:
            self.closed = True
            workers, self.slots = [w for w in self.slots if w is not None], []
        for w in workers:
            w.stop("the run is stopping")

    def kill(self) -> None:
        """SIGKILL to every worker, waiting for nothing (the stop of last resort)."""
        for w in list(self.slots):
            if w is not None:
                w.child.signal_kill()


def agent_runner(r) -> "AgentPool | CommandAgent":
    """The runner rollout.agent or rollout.agent_command names."""
    if r.agent:
        threads = -(-r.concurrency // r.agent_workers)
        return AgentPool(r.agent, r.agent_workers, threads, r.agent_timeout, python=r.agent_python)
    return CommandAgent(r.agent_command, r.agent_timeout)


def check_agent_python(r) -> None:
    """Before any service starts (preflight): the interpreter rollout.agent_python names runs Python >= 3.9
    and imports the agent there (a worker started and stopped); ValueError in one line otherwise."""
    if r.agent and r.agent_python:
        check_python(r.agent_python)
        start_worker(r.agent, 1, r.agent_python)[0].stop("checked")
