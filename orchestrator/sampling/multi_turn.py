"""rollout.multi_turn=true: every sample is an episode in the environment service (env.*).

For each sample: Reset the episode with the row's task, then turn by turn generate (stopping at the
environment's stop strings, e.g. the calculator's "</calc>"), send the turn's text to Step, and append
the observation it returns as tokens, until the episode is done, rollout.max_turns turns have been
taken, or the response holds rollout.max_response_tokens tokens. The policy's tokens keep the ids and
log-probs they were sampled with (never decoded and encoded again); observations are the tokenizer's
encoding of their text.

With rollout.tool_parser (e.g. "hermes") the episode speaks the model's own tool format instead: the
prompt is rendered with the tools' schemas (the row's `tools`, else the environment's), a turn ends at
an end token, the tool calls parsed from it go to the environment in one Step, and their results come
back as `tool` messages rendered by the chat template after the closed turn (meshrl.chat.after_turn); a
turn without calls is the final answer. Preflight has checked that the template renders all of this and
that the parser reads back the calls it writes (orchestrator/lifecycle/tool_template.py).

The result is verl's layout, one row per trajectory: `responses` holds every turn and observation,
`response_mask` is 1 on the policy's tokens and 0 on observations, `rollout_logprobs` is 0 on
observations; columns `turns`, `turn_spans` ([start, end) of each policy turn in the response),
`env_reward`, `env_error` and `tool_calls`. The batch's weight version is the oldest any turn used.

Trajectories run side by side (rollout.concurrency at once), so a slow tool holds back only its own
trajectory; their turns meet in a Batcher, which sends the turns waiting at the same moment to the
rollout as one Generate call (a few calls in flight). A failing environment call (a crash, a timeout,
a refused action) ends that trajectory with `env_error` set and reward env.error_score, never the run.
Which turns share a call depends on the tools' timing, so multi-turn samples are not bit-reproducible.
With a rollout fleet each replica has a batcher of its own, and an episode stays on one replica for all
its turns (the prefix it has computed is there).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import threading
import time
from typing import Any

import grpc
import numpy as np
import torch

from meshrl import seeds
from meshrl.algos import masked
from meshrl.chat import after_turn, as_tools, render
from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.layout import prompt_tensors, rollout_tensors
from meshrl.models import end_ids, generation_config
from meshrl.tool_calls import Call, parser_for
from meshrl.trajectory import Trajectory
from meshrl.v1 import env_pb2

log = logging.getLogger(__name__)
MAX_CALLS_IN_FLIGHT = 4  # Generate calls the batcher keeps going at once
GATHER_S = 0.02  # how long the batcher waits for more turns, once one is waiting, before it sends
Turn = tuple[list[int], list[float], str | None, int]  # what Batcher.generate returns


class Batcher:
    """Turns of many trajectories to the rollout as few Generate calls (input_ids, n=1), up to
    MAX_CALLS_IN_FLIGHT at once. A call goes out once every trajectory that could ask for a turn is
    asking (those in a tool call are not waited for) or no turn has joined for GATHER_S."""

    def __init__(
        self, mesh, stop: list[str], seed: int, greedy: bool = False, replica: str = "rollout", spacing: int = 1
    ):
        """`spacing`: how far apart two calls' seeds are (row i of a call samples with its seed + i); 1, as
        multi-turn runs have always sampled, lets row 1 of one call and row 0 of the next share a seed."""
        self.mesh, self.stop, self.seed, self.greedy, self.replica = mesh, stop, seed, greedy, replica
        self.spacing = spacing
        self.waiting: list[tuple[list[int], int, concurrent.futures.Future[Turn]]] = []
        self.cond = threading.Condition()
        self.closed, self.calls = False, 0
        self.active = self.in_tool = self.generating = 0  # trajectories playing; in a tool call; in a call
        self.pool = concurrent.futures.ThreadPoolExecutor(MAX_CALLS_IN_FLIGHT, thread_name_prefix="meshrl-turns")
        self.slots = threading.Semaphore(MAX_CALLS_IN_FLIGHT)
        self.thread = threading.Thread(target=self._run, name="meshrl-batcher", daemon=True)
        self.thread.start()

    def generate(self, ids: list[int], max_new: int, n: int = 1) -> list[Turn]:
        """n turns after `ids`, each (tokens, log-probs, text (None when cut to max_new), weight version)."""
        futures: list[concurrent.futures.Future[Turn]] = [concurrent.futures.Future() for _ in range(n)]
        with self.cond:
            self.waiting += [(ids, max_new, f) for f in futures]
            self.cond.notify_all()
        return [f.result() for f in futures]

    def count(self, active: int = 0, in_tool: int = 0) -> None:
        """A trajectory starts or ends (active), or enters or leaves a tool call (in_tool)."""
        with self.cond:
            self.active += active
            self.in_tool += in_tool
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(60)
        self.pool.shutdown(wait=True)

    def _run(self) -> None:
        while True:
            self.slots.acquire()  # a free call first, so the turns that arrive meanwhile go in it
            with self.cond:
                self.cond.wait_for(lambda: self.waiting or self.closed)
                if self.closed and not self.waiting:
                    self.slots.release()
                    return
                seen = -1
                while len(self.waiting) != seen and len(self.waiting) < self.active - self.in_tool - self.generating:
                    seen = len(self.waiting)  # more may come: until none joined for GATHER_S
                    self.cond.wait(GATHER_S)
                batch, self.waiting = self.waiting, []
                self.generating += len(batch)
                self.calls += 1
                seed = self.seed * seeds.CALL + self.calls * self.spacing
            self.pool.submit(self._call, batch, seed)

    def _call(self, batch: list, seed: int) -> None:
        try:
            for part, part_seed in by_room(batch, seed, self.mesh.cfg.rollout.max_model_len):
                self._send(part, part_seed)
        except BaseException as e:  # every turn of the call sees it
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(e)
        finally:
            with self.cond:
                self.generating -= len(batch)
                self.cond.notify_all()
            self.slots.release()

    def _send(self, batch: list, seed: int) -> None:
        """One Generate for `batch`; a row the rollout refuses (INVALID_ARGUMENT) fails its own turn alone:
        the call is sent again row by row, so that the other trajectories' turns go on."""
        try:
            reply = self.mesh.generate(
                DataProto(prompt_tensors([b[0] for b in batch], 0)),
                seed=seed,
                n=1,
                stop=self.stop,
                greedy=self.greedy,
                colocated=False,
                max_new_tokens=max(b[1] for b in batch),
                replica=self.mesh.router.pick(len(batch), prefer=self.replica),
            )
        except ServiceError as e:
            if e.code != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            if len(batch) == 1:
                batch[0][2].set_exception(e)
                return
            log.warning("the rollout refused a turn (%s); sending the call's %d turns one by one", e, len(batch))
            for i, row in enumerate(batch):
                self._send([row], seed + i)
            return
        version = int(reply.meta_info.get("weight_version", 0))
        for i, (_, max_new, future) in enumerate(batch):
            n = int(reply.batch["response_mask"][i].sum())
            n_kept = min(n, max_new)
            tokens = reply.batch["responses"][i, :n_kept].tolist()
            logprobs = (
                reply.batch["rollout_logprobs"][i, :n_kept].tolist()
                if "rollout_logprobs" in reply.batch
                else [0.0] * n_kept
            )  # greedy (validation): none asked for
            text = reply.non_tensor_batch["response_text"][i] if n_kept == n else None
            future.set_result((tokens, logprobs, text, version))


def by_room(batch: list, seed: int, max_model_len: int) -> list[tuple[list, int]]:
    """A batcher's turns as Generate calls that each fit the context: one call takes the longest max_new
    of its turns, so a turn near the model's limit (250 + its own 6 fits 256, + another's 8 does not)
    goes in a call of the turns with its own max_new. Each call keeps seeds apart from the others'."""
    top = max(b[1] for b in batch)
    fits = [b for b in batch if len(b[0]) + top <= max_model_len]
    if len(fits) == len(batch):
        return [(batch, seed)]
    parts: dict[int, list] = {}
    for b in batch:
        if len(b[0]) + top > max_model_len:
            parts.setdefault(b[1], []).append(b)
    calls, start = ([(fits, seed)] if fits else []), seed + len(batch)
    for part in parts.values():
        calls.append((part, start))
        start += len(part)
    return calls


@functools.lru_cache(maxsize=8)
def turn_ends(model: str, tokenizer) -> frozenset[int]:
    """Every token the engines end a turn at, as they read them (the tokenizer's eos and the model's
    generation config's); read from the model folder once, not every step."""
    return frozenset(end_ids(tokenizer, generation_config(model)))


def cell(columns: dict, name: str, row: int):
    return columns[name][row] if name in columns else None


def task_of(columns: dict, row: int) -> dict:
    """The episode's task from the row's verl columns."""
    rm = cell(columns, "reward_model", row)
    return {
        "data_source": cell(columns, "data_source", row) or "",
        "ground_truth": rm.get("ground_truth") if isinstance(rm, dict) else None,
        "extra_info": cell(columns, "extra_info", row),
    }


def jsonable(value):
    return value.tolist() if hasattr(value, "tolist") else str(value)


def play(traj: Trajectory, mesh, batcher: Batcher, tokenizer, seed: int, *, parser, ends: frozenset[int]) -> None:
    """One episode, filling `traj`. Environment failures end it with traj.error; a rollout failure raises.
    With a tool-call parser (rollout.tool_parser), a turn's calls go to the environment and their results
    come back through the chat template (tool_results); without one, the turn's text is the action. `ends`:
    the tokens that end a turn (the model's end tokens: Qwen's <|im_end|> and <|endoftext|>)."""
    episode = Episode(traj, mesh.cfg.rollout, mesh["env"], batcher, tokenizer, parser, ends)
    batcher.count(active=1)
    try:
        first = episode.call(
            "Reset", env_pb2.ResetRequest(task_json=json.dumps(traj.task, default=jsonable), seed=seed)
        )
        episode.id = first.episode_id
        episode.observe(first.observation)
        for _ in range(episode.cfg.max_turns):
            if not episode.turn():
                break
    except ServiceError as e:
        method = e.method.replace("/", ".").rsplit(".", 1)[-1]
        if method not in ("Reset", "Step"):
            raise
        traj.error = f"{method}: {e.code.name}: {e.details}"
    finally:
        batcher.count(active=-1)
        episode.close()


@dataclasses.dataclass
class Episode:
    """play()'s episode: its trajectory, the run's rollout settings, the environment's client and the id of
    the episode there (None once it is done or closed)."""

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
    mesh, prompts: DataProto, seed: int, tokenizer, n: int | None = None, greedy: bool = False
) -> tuple[DataProto, Scores, dict]:
    """(gen, scored, {"gen": s, "reward": s}): n (default rollout.n; greedy: 1) episodes per prompt."""
    r = mesh.cfg.rollout
    start = time.perf_counter()
    rows = prompts.repeat(n or (1 if greedy else r.n), interleave=True)
    ids, attn = rows.batch["input_ids"], rows.batch["attention_mask"]
    trajectories = [
        Trajectory(ids[i][attn[i].bool()].tolist(), task_of(rows.non_tensor_batch, i)) for i in range(len(rows))
    ]
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
    try:  # rollout.colocate: the device goes to the rollout for the whole batch of episodes
        with (
            mesh.colocated_generation(),
            concurrent.futures.ThreadPoolExecutor(r.concurrency, thread_name_prefix="meshrl-episode") as pool,
        ):
            futures = [
                pool.submit(
                    play,
                    t,
                    mesh,
                    batchers[i % len(batchers)],
                    tokenizer,
                    seed * seeds.EPISODE + i,
                    parser=parser,
                    ends=ends,
                )
                for i, t in enumerate(trajectories)
            ]
            for f in futures:
                f.result()
    finally:
        for batcher in batchers:
            batcher.close()
    gen = layout(rows, trajectories, tokenizer)
    generated = time.perf_counter()
    scored = scores(mesh, gen, trajectories)
    return gen, scored, {"gen": generated - start, "reward": time.perf_counter() - generated}


def layout(rows: DataProto, trajectories: list[Trajectory], tokenizer) -> DataProto:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tensors = rollout_tensors(
        [t.prompt for t in trajectories],
        [t.tokens for t in trajectories],
        pad,
        [t.mask for t in trajectories],
        [t.logprobs for t in trajectories],
    )
    columns: dict[str, np.ndarray | list] = dict(rows.non_tensor_batch)
    columns.update(
        {
            "response_text": [tokenizer.decode(t.tokens, skip_special_tokens=True) for t in trajectories],
            "finish_reason": [t.finish for t in trajectories],
            "turns": [len(t.spans) for t in trajectories],
            "turn_spans": [json.dumps(t.spans) for t in trajectories],
            "env_reward": [t.env_reward for t in trajectories],
            "env_error": [t.error for t in trajectories],
            "tool_calls": [int(t.info.get("tool_calls", 0)) for t in trajectories],
        }
    )
    versions = [v for t in trajectories for v in t.versions]
    return DataProto(
        tensors,
        {k: np.array(v, dtype=object) for k, v in columns.items()},
        {"weight_version": min(versions) if versions else 0, "pad_token_id": pad},
    )


def scores(mesh, gen: DataProto, trajectories: list[Trajectory]) -> Scores:
    """The environment's rewards (env.reward=env), the reward service's (service), or their sum (sum);
    a trajectory the environment failed gets env.error_score. Metrics: multi_turn/*."""
    e = mesh.cfg.env
    failed = [bool(t.error) for t in trajectories]
    env_scores = torch.tensor(
        [e.error_score if bad else t.env_reward for t, bad in zip(trajectories, failed)], dtype=torch.float32
    )
    service = mesh.score(gen) if e.reward in ("service", "sum") else None
    total = env_scores if service is None else service.scores + (env_scores if e.reward == "sum" else 0)
    columns = dict(service.columns) if service is not None else {}
    if "acc" not in columns and any("acc" in t.info for t in trajectories):
        columns["acc"] = np.array([bool(t.info.get("acc", False)) for t in trajectories], dtype=object)
    columns["env_error"] = gen.non_tensor_batch["env_error"]
    n = len(trajectories)
    metrics = {
        **(service.metrics if service is not None else {}),
        "multi_turn/turns/mean": sum(len(t.spans) for t in trajectories) / n,
        "multi_turn/tool_calls/mean": float(np.mean(gen.non_tensor_batch["tool_calls"].astype(float))),
        "multi_turn/done_frac": sum(t.done for t in trajectories) / n,
        "multi_turn/env_reward/mean": float(sum(t.env_reward for t in trajectories) / n),
        "multi_turn/num_env_failed": float(sum(failed)),
    }
    if any(failed):
        first = next(t.error for t in trajectories if t.error)
        log.warning(
            "%d of %d episodes failed in the environment and got env.error_score; first: %s", sum(failed), n, first
        )
    return Scores(total, masked.token_level(total, gen.batch["response_mask"]), columns, metrics)
