"""What an agent's episode scores: its reward and info from what the agent returned (or why it is lost),
and, where the agent's module defines score_group, its group's scores in place of its own (docs/agents.md,
"Scoring a group together"). orchestrator/agents/episode.py plays the episodes and
orchestrator/sampling/agents.py applies these to a step's."""

from __future__ import annotations

from typing import Any, NamedTuple

from meshrl.trajectory import Trajectory


def reward_error(reward, needed: bool) -> str:
    if reward is None:
        return "the agent returned no reward (env.reward=service scores its final answer instead)" if needed else ""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return f"the agent's reward must be a number, got {reward!r:.60}"
    return ""


class Played(NamedTuple):
    traj: Trajectory
    calls: int  # the calls its agent made
    samples: int  # the samples they recorded (> 1: the agent branched)
    key: str  # the episode's key, which its agent got
    result: Any  # what its agent returned


def reward_of(result):
    return result.get("reward") if isinstance(result, dict) else result


def settle(traj: Trajectory, result, error: str) -> None:
    """The episode's reward and info from what its agent (or its group's scoring) returned; lost (error)
    with env.error_score's place held at 0."""
    if isinstance(result, dict):
        traj.info = {k: v for k, v in result.items() if k != "reward"}
    traj.env_reward, traj.error = 0.0 if error else float(reward_of(result) or 0.0), error
    traj.done, traj.finish = (False, "length") if error else (True, "stop")


def score_groups(runner, played: list[Played], size: int, needs_reward: bool) -> None:
    """Where the agent's module defines score_group: each group (a prompt's `size` episodes) scored together
    by it, its scores in place of the episodes' own (None: theirs stand); a group it cannot score is lost
    whole, never scored 0 in part."""
    for start in range(0, len(played), size):
        part = played[start : start + size]
        results = [None if p.traj.error else p.result for p in part]
        scores, error = runner.score_group(start // size, [p.key for p in part], [p.traj.task for p in part], results)
        if not error and scores is not None and not (isinstance(scores, list) and len(scores) == len(part)):
            error = f"score_group returned {scores!r:.60} for a group of {len(part)}"
        if error:
            scores = [None] * len(part)
        elif scores is None:  # the episodes' own stand
            continue
        for p, score in zip(part, scores):
            if not p.traj.error:  # a lost episode stays lost, with its own reason
                why = reward_error(reward_of(score), needs_reward)
                settle(p.traj, score, f"its group could not be scored: {error}" if error else why)
