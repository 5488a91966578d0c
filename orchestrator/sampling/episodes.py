"""What every episode sampler shares (multi_turn: the environment service's episodes; agents: an agent's
through the OpenAI-compatible endpoint): the rows, a thread per episode, the batcher that sends the turns of
many episodes to the rollout as few Generate calls, the episodes' batch in verl's layout and their scores,
and what an episode sampler cannot be combined with (sampling.combinations reads it).

The layout is one row per trajectory (meshrl.trajectory.verl_rows).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
import numpy as np
import torch

from meshrl import seeds
from meshrl.algos import masked
from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.layout import prompt_tensors
from meshrl.models import end_ids, generation_config
from meshrl.trajectory import Trajectory, verl_rows
from orchestrator.sampling.sampled import Sampled, per_prompt

log = logging.getLogger(__name__)
T = TypeVar("T")
# what an episode sampler cannot be combined with ({key}: its own setting, {other}: the other's)
REFUSES = {
    "rollout experts": (
        "{other} takes the experts of single-turn samples; a multi-turn or agent episode's response holds "
        "observations the rollout never routed: use actor.router_replay=r2"
    ),
    "dpo": "{key} works with ppo, grpo, rloo and reinforce",
    "sft": "{key} works with ppo, grpo, rloo and reinforce",
}

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


def scores(mesh, gen: DataProto, trajectories: list[Trajectory], judged: bool = True) -> Scores:
    """The environment's rewards (env.reward=env), the reward service's (service; judged: and the judge's),
    or their sum (sum); a trajectory the environment failed gets env.error_score. Metrics: multi_turn/*."""
    e = mesh.cfg.env
    failed = [bool(t.error) for t in trajectories]
    env_scores = torch.tensor(
        [e.error_score if bad else t.env_reward for t, bad in zip(trajectories, failed)], dtype=torch.float32
    )
    service = mesh.score(gen, judged=judged) if e.reward in ("service", "sum") else None
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


def episode_rows(mesh, prompts: DataProto, n: int | None, greedy: bool) -> DataProto:
    """n (default rollout.n; greedy: 1) rows per prompt, a prompt's rows next to each other."""
    return prompts.repeat(per_prompt(mesh.cfg, n, greedy), interleave=True)


def prompt_ids(rows: DataProto, i: int) -> list[int]:
    return rows.batch["input_ids"][i][rows.batch["attention_mask"][i].bool()].tolist()


def play_all(
    mesh, jobs: Sequence[Callable[[], T]], name: str, on_failure: Callable[[], None] | None = None, workers: int = 0
) -> list[T]:
    """Every job (an episode, or a Generate call) on a thread, `workers` (0: rollout.concurrency) at once,
    the device the rollout's for all of them (rollout.colocate). A failure (the rollout's, or Ctrl-C)
    cancels the jobs not started, and on_failure() ends those in flight before the threads are waited for;
    then it is raised."""
    with (
        mesh.colocated_generation(),
        concurrent.futures.ThreadPoolExecutor(workers or mesh.cfg.rollout.concurrency, thread_name_prefix=name) as pool,
    ):
        futures = [pool.submit(job) for job in jobs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            if on_failure is not None:
                on_failure()
            raise


def finished(
    mesh, rows: DataProto, trajectories: list[Trajectory], tokenizer, start: float, *, judged: bool, on_generated
) -> Sampled:
    """The episodes in verl's layout and scored; timing_s/gen since `start`, then timing_s/reward."""
    gen = verl_rows(rows, trajectories, tokenizer)
    generated = time.perf_counter()
    if on_generated is not None:
        on_generated()
    scored = scores(mesh, gen, trajectories, judged)
    return Sampled(gen, scored, {"timing_s/gen": generated - start, "timing_s/reward": time.perf_counter() - generated})
