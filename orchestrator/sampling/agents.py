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
import time

from meshrl import seeds
from meshrl.chat import as_tools
from meshrl.dataproto import DataProto
from meshrl.gateway.protocol import Limits
from meshrl.gateway.server import Gateway
from meshrl.gateway.sessions import Session
from meshrl.vocab import model_vocab_size
from orchestrator.agents.episode import FleetEngine, close_runners, play, runner_for
from orchestrator.agents.sandbox import sandbox_for
from orchestrator.agents.scores import score_groups
from orchestrator.sampling import episodes
from orchestrator.sampling.sampled import Sampled, per_prompt

log = logging.getLogger(__name__)
# calls' seeds are seeds.AGENT_CALL_SPACING apart: a group's episodes call at different times, and row i of a
#   call samples with its seed + i, so calls one apart would give two of them the same seed
MODEL = "policy"  # the model's name on the endpoint (any name an agent sends is served by the policy)


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


def sample(
    mesh, prompts: DataProto, seed: int, tokenizer=None, *, n=None, greedy=False, judged=True, on_generated=None
) -> Sampled:
    """n (default rollout.n; greedy: 1) agent episodes per prompt (sampling.sampled's form)."""
    r, start = mesh.cfg.rollout, time.perf_counter()
    rows = episodes.episode_rows(mesh, prompts, n, greedy)

    def batcher(replica: str, stop: list[str], k: int) -> episodes.Batcher:
        return episodes.Batcher(mesh, stop, seed + seeds.BATCHER * k, greedy, replica, seeds.AGENT_CALL_SPACING)

    engine = FleetEngine(mesh.replicas, batcher)
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
