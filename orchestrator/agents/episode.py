"""One agent episode in a run: the agent's run against a key of its own on the run's endpoint, and its
recording as a Trajectory (play); the endpoint's engine, which sends the calls of many episodes to the
rollout fleet through batchers (FleetEngine); and the run's agent runners, which live for the whole run
(runner_for, close_runners). orchestrator/sampling/agents.py samples a step's episodes with these."""

import threading
from collections.abc import Callable
from typing import Protocol

from meshrl.errors import ServiceError
from meshrl.gateway.protocol import Request
from meshrl.gateway.server import Gateway
from meshrl.gateway.sessions import BINDING, Session
from meshrl.trajectory import Trajectory
from orchestrator.agents.pool import AgentPool, CommandAgent, agent_runner
from orchestrator.agents.scores import Played, reward_error, reward_of, settle

_lock = threading.Lock()


class Turns(Protocol):
    """What the engine asks of a batcher (orchestrator/sampling/episodes.Batcher)."""

    def generate(self, ids: list[int], max_new: int, n: int = 1) -> list: ...

    def count(self, active: int = 0, in_tool: int = 0) -> None: ...

    def close(self) -> None: ...


RUNNERS: dict[int, AgentPool | CommandAgent] = {}  # per run (its mesh): workers live for the whole run
_lock = threading.Lock()


def runner_for(mesh) -> AgentPool | CommandAgent:
    with _lock:
        if id(mesh) not in RUNNERS:
            RUNNERS[id(mesh)] = agent_runner(mesh.cfg.rollout)
        return RUNNERS[id(mesh)]


def close_runners(kill: bool = False) -> None:
    """Stop every agent worker (a run's way out); kill: SIGKILL, waiting for nothing."""
    with _lock:
        runners = list(RUNNERS.values())
        if not kill:
            RUNNERS.clear()
    for r in runners:
        r.kill() if kill else r.close()


class FleetEngine:
    """The gateway's engine in a run: a session's calls go to a batcher on its replica (one per replica
    and stop list), sampled with the run's settings. An episode counts as playing on its replica's batcher
    from its start to its end, so that a batcher holds a call while other episodes' turns keep joining it
    (GATHER_S apart at most): one Generate for many turns, as on the multi-turn path. (An agent is never
    counted as in a tool: what it does between calls is its own, and a pause longer than GATHER_S sends
    the call anyway.)"""

    def __init__(self, replicas: list[str], batcher: Callable[[str, list[str], int], Turns]):
        """`batcher(replica, stop, k)`: the k-th batcher the engine makes, for `replica`'s calls that stop at
        `stop` (the run's episodes.Batcher, its seed its own)."""
        self.replicas, self.make = replicas, batcher
        self.batchers: dict[tuple[str, tuple[str, ...]], Turns] = {}
        self.started = 0
        self.failure: BaseException | None = None  # the rollout's first failure: the step fails with it
        self.lock = threading.Lock()

    def _batcher(self, replica: str, stop: tuple[str, ...]) -> Turns:
        with self.lock:
            if (replica, stop) not in self.batchers:
                self.batchers[replica, stop] = self.make(replica, list(stop), len(self.batchers))
            return self.batchers[replica, stop]

    def begin(self, session: Session) -> None:
        """An episode starts: episode i on replica i mod R for all its calls (its prefix is there)."""
        with self.lock:
            session.replica = self.replicas[self.started % len(self.replicas)]
            self.started += 1
        self._batcher(session.replica, ()).count(active=1)

    def end(self, session: Session) -> None:
        self._batcher(session.replica or "", ()).count(active=-1)

    def generate(self, session: Session, ids: list[int], n: int, max_new: int, request: Request) -> list:
        if session.replica is None:
            raise RuntimeError("a call outside an episode")  # begin() gives every run session its replica
        stop = tuple(request.stop)
        batcher = self._batcher(session.replica, stop)
        # n turns wait where the episode counted one; a call with its own stop strings counts on its own
        change = n - 1 if not stop else n
        batcher.count(active=change)
        try:
            return batcher.generate(ids, max_new, n)
        except Exception as e:  # the agent gets a 503 and the step fails with it once its episodes end; the
            #   request's own refusal (INVALID_ARGUMENT) is the agent's 400 alone
            if not (isinstance(e, ServiceError) and e.code.name == "INVALID_ARGUMENT"):
                with self.lock:
                    self.failure = self.failure or e
            raise
        finally:
            batcher.count(active=-change)

    def close(self) -> None:
        for batcher in self.batchers.values():
            batcher.close()


def play(  # limit: an episode's parts
    gateway: Gateway,
    engine: FleetEngine,
    runner,
    task: dict,
    session: Session,
    *,
    fallback: list[int],
    needs_reward: bool,
    group: int,
) -> Played:
    """One episode (of `group`, its prompt's in the step): the agent's run against its own key, then its
    recording as a Trajectory."""
    engine.begin(session)
    session.owner = BINDING  # the key is its agent's alone: bound to its process once that starts
    gateway.open(session)
    try:
        result, error = runner.play(
            task, gateway.base_url, session.key, on_start=lambda pid: gateway.bind(session.key, pid), group=group
        )
    finally:
        gateway.close(session.key)
        engine.end(session)
    traj = session.final() or Trajectory(fallback)
    traj.task = task
    made_no_call = "" if session.final() is not None else "the agent made no call to the model"
    settle(traj, result, error or reward_error(reward_of(result), needs_reward) or made_no_call)
    return Played(traj, session.calls, len(session.samples), session.key, result)
