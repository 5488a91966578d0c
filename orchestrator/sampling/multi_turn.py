"""rollout.multi_turn=true: every sample is an episode in the environment service (env.*). What a run does
with them is docs/services.md's "Multi-turn rollouts and the environment service", and
rollout.tool_parser's way its "Tools in the model's own format".

An episode Resets the environment with the row's task, then turn by turn generates and Steps it with the
turn's text (or, with a tool-call parser, with the calls parsed from the turn, whose results come back
as `tool` messages rendered by the chat template: meshrl.chat.after_turn), appending what it observes as
tokens. The policy's tokens keep the ids and log-probs they were sampled with (never decoded and encoded
again); observations are the tokenizer's encoding of their text. Episodes run side by side
(rollout.concurrency); their turns meet in a batcher per replica (sampling.episodes), and an episode stays
on one replica for all its turns (the prefix it has computed is there). A failing environment call ends
that trajectory with `env_error` set, never the run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from typing import Any

import grpc

from meshrl import seeds
from meshrl.chat import after_turn, as_tools, render
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.tool_calls import Call, parser_for
from meshrl.trajectory import Trajectory
from meshrl.v1 import env_pb2
from orchestrator.data import cell, jsonable, task_of
from orchestrator.sampling.episodes import (
    Batcher,
    episode_rows,
    finished,
    play_all,
    prompt_ids,
    turn_ends,
)
from orchestrator.sampling.sampled import Sampled

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Episode:
    """One episode (play), filling `traj`: the run's rollout settings, the environment's client, the batcher
    of its replica, and the id of the episode there (None once it is done or closed). With a tool-call
    parser (rollout.tool_parser) a turn's calls go to the environment and their results come back through
    the chat template (tool_results); without one, the turn's text is the action. `ends`: the tokens that
    end a turn (the model's end tokens: Qwen's <|im_end|> and <|endoftext|>)."""

    traj: Trajectory
    cfg: Any  # the run's rollout section
    env: Any  # the environment service's client
    batcher: Batcher
    tokenizer: Any
    parser: Any
    ends: frozenset[int]
    id: str | None = None

    @property
    def budget(self) -> int:
        return self.cfg.max_response_tokens or self.cfg.max_turns * self.cfg.max_new_tokens

    def play(self, seed: int) -> None:
        """The episode. Environment failures end it with traj.error; a rollout failure raises."""
        self.batcher.count(active=1)
        try:
            task = json.dumps(self.traj.task, default=jsonable)
            first = self.call("Reset", env_pb2.ResetRequest(task_json=task, seed=seed))
            self.id = first.episode_id
            self.observe(first.observation)
            for _ in range(self.cfg.max_turns):
                if not self.turn():
                    break
        except ServiceError as e:
            method = e.method.replace("/", ".").rsplit(".", 1)[-1]
            if method not in ("Reset", "Step"):
                raise
            self.traj.error = f"{method}: {e.code.name}: {e.details}"
        finally:
            self.batcher.count(active=-1)
            self.close()

    def observe(self, text: str) -> None:
        if text:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self.traj.add(ids[: self.budget - len(self.traj.tokens)], None, policy=False)

    def call(self, method: str, request) -> env_pb2.EnvReply:  # Reset, Step
        self.batcher.count(in_tool=1)
        try:
            return self.env.call_message(method, request, env_pb2.EnvReply)
        finally:
            self.batcher.count(in_tool=-1)

    def turn(self) -> bool:
        """One turn of the model and the environment's answer; False when the episode is over."""
        traj, tokenizer = self.traj, self.tokenizer
        room = self.budget - len(traj.tokens)
        if room <= 0:
            return False
        [(tokens, logprobs, text, version)] = self.batcher.generate(
            traj.prompt + traj.tokens, min(self.cfg.max_new_tokens, room)
        )
        traj.add(tokens, logprobs, policy=True)
        traj.versions.append(version)
        if self.parser is not None and self.parser.special:  # the format's special tokens are in its calls
            text = self.parser.readable(tokens)
        elif text is None:  # cut to the token budget: the text of what is kept
            text = tokenizer.decode(tokens, skip_special_tokens=True)
        calls = self.parser(text) if self.parser is not None else []
        if calls:  # the model's own format: the calls answered, through the template's tool role
            assert self.id is not None  # Reset named the episode; it is None only once it is over
            results = tool_results(self.call, self.env, self.id, text, calls)
            closed = "" if tokens and tokens[-1] in self.ends else tokenizer.eos_token  # a cut turn, closed
            self.observe(closed + after_turn(tokenizer, results, traj.tools))
            return True
        reply = self.call("Step", env_pb2.StepRequest(episode_id=self.id, action=text))
        traj.env_reward += reply.reward
        traj.info = json.loads(reply.info_json or "{}")
        if reply.done:
            traj.done, traj.finish, self.id = True, "stop", None
            return False
        self.observe(reply.observation)
        return True

    def close(self) -> None:
        """A limit ended it, or a failure: free it on the environment's side."""
        if self.id is not None:
            try:
                self.env.call("Close", env_pb2.CloseRequest(episode_id=self.id))
            except ServiceError as e:
                log.debug("closing episode %s failed: %s", self.id, e)


def tool_results(call, env, episode: str, text: str, calls: list[Call]) -> list[dict]:
    """The tool messages answering a turn's calls, in order: the environment's results for the calls it
    can make, and for a call that could not be parsed, the parser's error."""
    good = [{"name": c.name, "arguments": c.arguments} for c in calls if not c.error]
    answers: list[str] = []
    if good:
        request = env_pb2.StepRequest(episode_id=episode, action=text, tool_calls_json=json.dumps(good))
        answers = list(call("Step", request).tool_results)
        if len(answers) != len(good):
            raise ServiceError(
                env.address, "EnvService/Step", grpc.StatusCode.INTERNAL, f"{len(answers)} results to {len(good)} calls"
            )
    answered = iter(answers)
    return [{"role": "tool", "content": f"error: {c.error}" if c.error else next(answered)} for c in calls]


def sample(
    mesh, prompts: DataProto, seed: int, tokenizer=None, *, n=None, greedy=False, judged=True, on_generated=None
) -> Sampled:
    """n (default rollout.n; greedy: 1) episodes per prompt (sampling.sampled's form)."""
    r, start = mesh.cfg.rollout, time.perf_counter()
    rows = episode_rows(mesh, prompts, n, greedy)
    trajectories = [Trajectory(prompt_ids(rows, i), task_of(rows.non_tensor_batch, i)) for i in range(len(rows))]
    parser = parser_for(r.tool_parser, tokenizer)
    if parser is not None:  # the prompt lists the row's tools, or else the environment's
        for i, t in enumerate(trajectories):
            t.tools = as_tools(cell(rows.non_tensor_batch, "tools", i), f"row {i}") or mesh.env_tools or None
            text = render(tokenizer, rows.non_tensor_batch["prompt"][i], f"row {i}", t.tools)
            t.prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    # a batcher per replica of the fleet, episode i on replica i mod R for all its turns (its prefix is there);
    # in the model's own format a turn ends at its end token, not at the text protocol's stop strings
    stop = [] if parser is not None else mesh.env_stop
    batchers = [Batcher(mesh, stop, seed + seeds.BATCHER * k, greedy, name) for k, name in enumerate(mesh.replicas)]
    # every token the engines end a turn at, as they read them (the tokenizer's eos and the generation config's)
    ends = turn_ends(mesh.cfg.actor.model, tokenizer)
    env = mesh["env"]
    try:
        jobs = [
            functools.partial(
                Episode(t, r, env, batchers[i % len(batchers)], tokenizer, parser, ends).play, seed * seeds.EPISODE + i
            )
            for i, t in enumerate(trajectories)
        ]
        play_all(mesh, jobs, "meshrl-episode")
    finally:
        for batcher in batchers:
            batcher.close()
    return finished(mesh, rows, trajectories, tokenizer, start, judged=judged, on_generated=on_generated)
