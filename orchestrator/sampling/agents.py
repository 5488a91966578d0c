"""rollout.agent / rollout.agent_command: every sample is an episode of an agent program that talks to the
policy through an OpenAI-compatible endpoint (meshrl/gateway), as it would talk to any model server.

For each step an endpoint starts on 127.0.0.1 in this process, in front of the run's rollout fleet. Each
episode gets a key of its own (a gateway Session, valid for that episode only) and is played by the
agent (orchestrator/agents/pool.py) with the task: the row's `prompt` (chat messages), its `tools`, its
data_source, ground_truth and extra_info. Every call is recorded token for token; the episode's sample
is the recording its last call extended (meshrl/gateway/sessions.py), trained on the model's tokens only.

The score is the agent's: the number it returns, or the "reward" of the mapping it returns (whose other
keys, e.g. "acc", are kept as the environment's info), as env.reward=env reads it; env.reward=service
scores the final text with the reward service instead, sum adds both. An episode whose agent fails,
hangs past rollout.agent_timeout or returns no reward where one is needed is lost: it scores
env.error_score and counts in agent/episodes_lost, and the step goes on.

Sampling settings are the run's (rollout.temperature, top_p, top_k): the log-probs the loss uses assume
them, so an agent's own temperature is not honoured during training; its max_tokens (capped at
rollout.max_new_tokens), stop strings and n are. Calls of concurrent episodes meet in the multi-turn
path's batchers, one per replica; an episode stays on one replica.
"""

import functools
import json
import logging
import threading
import time

from meshrl import seeds
from meshrl.chat import as_tools
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.gateway.protocol import Limits, Request
from meshrl.gateway.server import Gateway
from meshrl.gateway.sessions import BINDING, Session
from meshrl.trajectory import Trajectory
from meshrl.vocab import model_vocab_size
from orchestrator.agents.pool import AgentPool, CommandAgent, agent_runner
from orchestrator.agents.sandbox import sandbox_for
from orchestrator.agents.scores import Played, reward_error, reward_of, score_groups, settle
from orchestrator.sampling import episodes
from orchestrator.sampling.sampled import Sampled, per_prompt

log = logging.getLogger(__name__)
# calls' seeds are seeds.AGENT_CALL_SPACING apart: a group's episodes call at different times, and row i of a
#   call samples with its seed + i, so calls one apart would give two of them the same seed
MODEL = "policy"  # the model's name on the endpoint (any name an agent sends is served by the policy)
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

    def __init__(self, mesh, seed: int, greedy: bool):
        self.mesh, self.seed, self.greedy = mesh, seed, greedy
        self.batchers: dict[tuple[str, tuple[str, ...]], episodes.Batcher] = {}
        self.started = 0
        self.failure: BaseException | None = None  # the rollout's first failure: the step fails with it
        self.lock = threading.Lock()

    def _batcher(self, replica: str, stop: tuple[str, ...]) -> episodes.Batcher:
        with self.lock:
            if (replica, stop) not in self.batchers:
                seed = self.seed + seeds.BATCHER * len(self.batchers)
                self.batchers[replica, stop] = episodes.Batcher(
                    self.mesh, list(stop), seed, self.greedy, replica, seeds.AGENT_CALL_SPACING
                )
            return self.batchers[replica, stop]

    def begin(self, session: Session) -> None:
        """An episode starts: episode i on replica i mod R for all its calls (its prefix is there)."""
        with self.lock:
            session.replica = self.mesh.replicas[self.started % len(self.mesh.replicas)]
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


def agent_task(columns: dict, row: int) -> dict:
    """What the agent is given: the row's prompt as chat messages, its tools, and its verl columns."""
    prompt = episodes.cell(columns, "prompt", row)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    task = {
        **episodes.task_of(columns, row),
        "prompt": messages,
        "tools": as_tools(episodes.cell(columns, "tools", row), f"row {row}"),
    }
    return json.loads(json.dumps(task, default=episodes.jsonable))  # parquet's arrays as lists


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


def sample(
    mesh, prompts: DataProto, seed: int, tokenizer=None, *, n=None, greedy=False, judged=True, on_generated=None
) -> Sampled:
    """n (default rollout.n; greedy: 1) agent episodes per prompt (sampling.sampled's form)."""
    r, start = mesh.cfg.rollout, time.perf_counter()
    rows = episodes.episode_rows(mesh, prompts, n, greedy)
    engine = FleetEngine(mesh, seed, greedy)
    model = mesh.cfg.actor.model
    limits = Limits(max_tokens=r.max_new_tokens, max_model_len=r.max_model_len, vocab_size=model_vocab_size(model))
    ends = episodes.turn_ends(model, tokenizer)
    sandbox = sandbox_for(mesh)  # rollout.agent_sandbox: POST /v1/sandbox/run
    gateway = Gateway(engine, tokenizer, MODEL, ends, tool_parser=r.tool_parser, limits=limits, sandbox=sandbox)
    runner, needs_reward = runner_for(mesh), mesh.cfg.env.reward in ("env", "sum")
    at = functools.partial(play, gateway, engine, runner, needs_reward=needs_reward)
    size = per_prompt(mesh.cfg, n, greedy)  # a group: a prompt's episodes, next to each other
    jobs = [
        functools.partial(
            at,
            agent_task(rows.non_tensor_batch, i),
            Session(budget=r.response_budget, max_calls=r.max_turns),
            fallback=episodes.prompt_ids(rows, i),
            group=i // size,
        )
        for i in range(len(rows))
    ]
    gateway.start()
    try:  # a failure (Ctrl-C, or a failing rollout): the episodes in flight end now, lost
        played = episodes.play_all(mesh, jobs, "meshrl-agent", on_failure=close_runners)
    finally:
        gateway.stop()
        engine.close()
    if engine.failure is not None:  # as on the multi-turn path: a rollout failure fails the step (recovery)
        raise engine.failure
    if runner.scores_groups():
        score_groups(runner, played, size, needs_reward)
    trajectories = [p.traj for p in played]
    got = episodes.finished(mesh, rows, trajectories, tokenizer, start, judged=judged, on_generated=on_generated)
    got.scored.metrics.update(
        {
            "agent/episodes_lost": float(sum(bool(t.error) for t in trajectories)),
            "agent/calls/mean": sum(p.calls for p in played) / len(played),
            "agent/samples/mean": sum(p.samples for p in played) / len(played),  # > 1: the agent branched
        }
    )
    return got
