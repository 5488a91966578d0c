"""rollout.agent / rollout.agent_command: every sample is an episode of an agent program that talks to the
policy through an OpenAI-compatible endpoint (meshrl/gateway), as it would talk to any model server;
docs/agents.md says what a run does with them.

For each step an endpoint starts on 127.0.0.1 in this process, in front of the run's rollout fleet. Each
episode gets a key of its own, valid for that episode only, and is played by the agent
(orchestrator/agents/episode.py) with the row's task. Every call is recorded token for token; the
episode's sample is the recording its last call extended (meshrl/gateway/sessions.py). The score is the
agent's, the reward service's or both (env.reward); an episode that fails is lost (env.error_score,
agent/episodes_lost), and the step goes on. Calls of concurrent episodes meet in the episode samplers'
batchers, one per replica; an episode stays on one replica.
"""

import functools
import logging
import time

from meshrl import seeds
from meshrl.dataproto import DataProto
from meshrl.gateway.protocol import Limits
from meshrl.gateway.server import Gateway
from meshrl.gateway.sessions import Session
from meshrl.vocab import model_vocab_size
from orchestrator.agents.episode import FleetEngine, close_runners, play, runner_for
from orchestrator.agents.sandbox import sandbox_for
from orchestrator.agents.scores import score_groups
from orchestrator.data import agent_task
from orchestrator.sampling import episodes
from orchestrator.sampling.sampled import Sampled, per_prompt

log = logging.getLogger(__name__)
# calls' seeds are seeds.AGENT_CALL_SPACING apart: a group's episodes call at different times, and row i of a
#   call samples with its seed + i, so calls one apart would give two of them the same seed
MODEL = "policy"  # the model's name on the endpoint (any name an agent sends is served by the policy)


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
