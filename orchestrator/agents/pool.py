"""Where agents run: a pool of worker processes for a Python agent (rollout.agent=FILE.py:function), or a
process per episode for a command in any language (rollout.agent_command).

    pool = agent_runner(cfg.rollout)           # AgentPool or CommandAgent
    result, error = pool.play(task, base_url, key)
    pool.close()

An episode that overruns rollout.agent_timeout is killed with everything it started (its own process
group) and its worker replaced; a crash, an exception or output that is not JSON loses that episode only,
with `error` saying why. A worker starts when the first episode needs it and serves the run's every step.
"""

import concurrent.futures
import json
import logging
import os
import queue
import select
import signal
import subprocess
import threading
from typing import Any

from meshrl.lifeline import child_env
from meshrl.pipes import Child, read_frame, write_frame

log = logging.getLogger(__name__)
START_TIMEOUT = 120.0  # seconds a worker may take to import the agent


class AgentPool:
    def __init__(self, spec: str, workers: int, timeout: float):
        self.spec, self.timeout = spec, timeout
        self.idle: queue.Queue[Child | None] = queue.Queue()
        for _ in range(workers):
            self.idle.put(None)  # started when first needed
        self.busy: set[Child] = set()
        self.lock = threading.Lock()
        self.closed = False
        # workers die with the thread that started them (meshrl.lifeline's kernel signal follows the thread):
        # they are started on threads that live as long as the pool, not on a step's short-lived ones
        self.starter = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="meshrl-agent-start")

    def _start(self) -> Child:
        child = Child("orchestrator.agents.worker", [self.spec], env=child_env())
        try:
            if not select.select([child.res_r], [], [], START_TIMEOUT)[0]:
                raise RuntimeError(f"an agent worker did not start within {START_TIMEOUT:g} s")
            msg = read_frame(child.res_r)
            if msg is None:
                raise RuntimeError(f"an agent worker exited while starting (exit code {child.proc.wait()})")
            if not msg["ready"]:
                raise ValueError(f"rollout.agent={self.spec}: {msg['error']}")
        except BaseException:
            child.kill()
            raise
        return child

    def play(self, task: dict, base_url: str, key: str) -> tuple[Any, str]:
        """(the agent's result, "") or (None, why the episode is lost). ValueError if the agent cannot load."""
        child = self.idle.get()
        try:
            if self.closed:
                raise RuntimeError("the agent pool is closed")
            child = child or self.starter.submit(self._start).result()
            with self.lock:
                self.busy.add(child)
            write_frame(child.task_w, {"task_json": json.dumps(task), "base_url": base_url, "api_key": key})
            if not select.select([child.res_r], [], [], self.timeout)[0]:
                child = self._lose(child)
                return None, f"the agent did not finish within rollout.agent_timeout={self.timeout:g} s"
            reply = read_frame(child.res_r)
            if reply is None:
                code = child.proc.poll()
                child = self._lose(child)
                return None, f"the agent's process died (exit code {code})"
            if not reply["ok"]:
                log.debug("an agent failed: %s\n%s", reply["error"], reply.get("where", ""))
                return None, f"the agent raised {reply['error']}"
            return json.loads(reply["result_json"]), ""
        except (BrokenPipeError, OSError) as e:
            child = self._lose(child)
            return None, f"the agent's process went away: {e}"
        finally:
            with self.lock:
                self.busy.discard(child)  # type: ignore[arg-type]
            self.idle.put(child)

    def _lose(self, child: Child | None) -> None:
        if child is not None:
            with self.lock:
                self.busy.discard(child)
            child.kill()
        return None

    def close(self) -> None:
        """Stop every worker: idle ones at once, busy ones killed (their episodes are lost)."""
        self.closed = True
        with self.lock:
            for child in self.busy:
                child.signal_kill()
        self.starter.shutdown(wait=False)
        while True:
            try:
                child = self.idle.get_nowait()
            except queue.Empty:
                return
            if child is not None:
                child.kill()

    def kill(self) -> None:
        """SIGKILL to every worker, waiting for nothing (the stop of last resort)."""
        with self.lock:
            for child in self.busy:
                child.signal_kill()


class CommandAgent:
    """rollout.agent_command: `sh -c COMMAND` per episode, with OPENAI_BASE_URL, OPENAI_API_KEY and
    MESHRL_TASK in its environment and the task as JSON on stdin; its result is the last line it prints."""

    def __init__(self, command: str, timeout: float):
        self.command, self.timeout = command, timeout
        self.procs: set[subprocess.Popen] = set()
        self.lock = threading.Lock()

    def play(self, task: dict, base_url: str, key: str) -> tuple[Any, str]:
        text = json.dumps(task)
        env = child_env({**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "MESHRL_TASK": text})
        proc = subprocess.Popen(
            ["sh", "-c", self.command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
            text=True,
        )
        with self.lock:
            self.procs.add(proc)
        try:
            out, err = proc.communicate(text, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc)
            proc.communicate()
            return None, f"the agent command did not finish within rollout.agent_timeout={self.timeout:g} s"
        finally:
            with self.lock:
                self.procs.discard(proc)
        if proc.returncode:
            tail = err.strip().splitlines()[-1:] or [""]
            return None, f"the agent command exited with {proc.returncode}: {tail[0][:300]}"
        lines = [line for line in out.splitlines() if line.strip()]
        try:
            return json.loads(lines[-1]), ""
        except (IndexError, ValueError):
            return None, f"the agent command's last line is not JSON: {(lines or [''])[-1][:200]!r}"

    def close(self) -> None:
        self.kill()

    def kill(self) -> None:
        with self.lock:
            for proc in self.procs:
                _killpg(proc)


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def agent_runner(r) -> "AgentPool | CommandAgent":
    """The runner rollout.agent or rollout.agent_command names."""
    if r.agent:
        return AgentPool(r.agent, r.agent_workers, r.agent_timeout)
    return CommandAgent(r.agent_command, r.agent_timeout)
