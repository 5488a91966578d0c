"""rollout.partial: partial rollouts. A step no longer waits for its longest sample; unfinished samples are
carried into the next step and go on there, on the newer weights, from the tokens they have.

    carry = Partial(cfg, data, tokenizer)                          # the run's (run.state.RunState)
    gen, scored, seconds, metrics = carry.sample(mesh, number, indices, uids, more)
    carry.commit()                                                 # the step is done: its carry stands
    carry.state_dict() / load_state_dict(...)                      # in a checkpoint's orchestrator.json

A step samples in rounds. Before each round the pool of started groups is topped up to
data.train_batch_size unfinished groups from the step's batch (then from `more`, the run's sampler),
and every unfinished sample generates at most rollout.partial_tokens more tokens: a new group's
rollout.n samples from its prompt, a carried sample from its prompt and its tokens so far (a prompt the
rollout prefills again; vLLM's prefix cache keeps most of it). A sample is finished when it ends
(finish_reason other than "length") or reaches rollout.max_new_tokens. The step ends after the first
round that leaves data.train_batch_size whole groups finished; it trains on that many, the oldest
first, and carries the rest, finished or not. Groups stay whole: a group trains when all its samples
are done, so its baseline compares answers to the same prompt.

Each token keeps the version that produced it and its log-prob under those weights (rollout_versions,
rollout_logprobs: the behaviour policy the off-policy correction, algorithm.rollout_is, compares with).
A sample's staleness counts from its oldest token: at step s a group whose oldest token is older than
s - 1 - trainer.max_staleness can no longer be trained and is dropped (partial/dropped_groups), so the
bound holds for every trained sample. Nothing samples ahead in this mode (the staleness budget is the
carry's).

Determinism: the rounds' calls carry seeds of the step and the round (a new group's prompt i with
seed + i, a carried sample j with its call's seed + j), the pool's order is the order groups started,
and the carry is part of each checkpoint, so a resumed run samples what an uninterrupted one does.
A step that fails is done again from the carry it started from (commit() is the run loop's, after it).
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import json
import time
from collections.abc import Callable

import torch

from meshrl.clients import Scores
from meshrl.dataproto import DataProto, object_array
from meshrl.layout import VERSIONS, rollout_tensors
from orchestrator.sampling.samples import sampling_seed

CARRIED_SEED = 104_729  # a round's calls for carried samples add this to its seed (new groups: its seed)


@dataclasses.dataclass
class Sample:
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)  # the weights that produced each token
    finish: str = ""  # the last call's finish_reason
    done: bool = False


@dataclasses.dataclass
class Group:
    index: int  # the dataset's row
    uid: str
    samples: list[Sample] = dataclasses.field(default_factory=list)  # rollout.n once started

    @property
    def done(self) -> bool:
        return bool(self.samples) and all(s.done for s in self.samples)

    @property
    def oldest(self) -> int | None:
        """The oldest weight version among its tokens (None: none yet)."""
        versions = [min(s.versions) for s in self.samples if s.versions]
        return min(versions) if versions else None


@dataclasses.dataclass
class Carry:
    queue: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # drawn, not started
    groups: list[Group] = dataclasses.field(default_factory=list)  # started (finished or not), in order


def response_lengths(gen: DataProto) -> list[int]:
    return gen.batch["response_mask"].sum(-1).long().tolist()


class Partial:
    def __init__(self, cfg, data, tokenizer):
        self.cfg, self.data, self.tokenizer = cfg, data, tokenizer
        r = cfg.rollout
        self.n, self.limit = r.n, r.max_new_tokens
        self.budget = r.partial_tokens or max(1, r.max_new_tokens // 4)
        self.groups = cfg.data.train_batch_size
        self.staleness = cfg.trainer.max_staleness
        self.carry = Carry()  # after the last step done
        self.pending: Carry | None = None  # after the step being done

    # ---- the run loop's side --------------------------------------------------------------

    def commit(self) -> None:
        if self.pending is not None:
            self.carry, self.pending = self.pending, None

    def state_dict(self) -> dict:
        return dataclasses.asdict(self.carry)

    def load_state_dict(self, state: dict) -> None:
        state = json.loads(json.dumps(state))  # as a checkpoint holds it: every sample's lists its own
        self.carry = Carry(
            [(int(i), str(u)) for i, u in state["queue"]],
            [Group(g["index"], g["uid"], [Sample(**s) for s in g["samples"]]) for g in state["groups"]],
        )
        self.pending = None

    # ---- a step ----------------------------------------------------------------------------

    def sample(
        self, mesh, number: int, indices: list[int], uids: list[str], more: Callable[[], tuple] | None
    ) -> tuple[DataProto, Scores, dict[str, float], dict[str, float]]:
        """Step `number`'s (gen, scored, timing_s/{gen,reward}, partial/* metrics): its batch (indices,
        uids) joins the queue of prompts to start, and rounds are sampled until the step has its groups."""
        carry = copy.deepcopy(self.carry)
        carry.queue.extend(zip(indices, uids))
        floor = number - 1 - self.staleness  # the oldest version step `number` may train on
        stale = [g for g in carry.groups if (g.oldest if g.oldest is not None else floor) < floor]
        carry.groups = [g for g in carry.groups if g not in stale]
        started = carried = len(carry.groups)
        rounds, start = 0, time.perf_counter()
        while sum(g.done for g in carry.groups) < self.groups:
            active = sum(not g.done for g in carry.groups)
            while len(carry.queue) < self.groups - active:
                if more is None:
                    raise RuntimeError("partial rollouts ran out of prompts to start")
                carry.queue.extend(zip(*more()))
            fresh = self.groups - active
            carry.groups += [Group(i, u) for i, u in carry.queue[:fresh]]
            carry.queue = carry.queue[fresh:]
            self.round(mesh, carry.groups, sampling_seed(self.cfg, number, rounds))
            rounds += 1
        started = len(carry.groups) - started
        generated = time.perf_counter()
        ready = sorted((g for g in carry.groups if g.done), key=lambda g: g.oldest or 0)  # stable: in start order
        take = ready[: self.groups]
        carry.groups = [g for g in carry.groups if not any(g is t for t in take)]
        gen = self.layout(take)
        scored = mesh.score(gen)
        self.pending = carry
        unfinished = [s for g in carry.groups for s in g.samples if not s.done]
        metrics = {
            "partial/rounds": float(rounds),
            "partial/started_groups": float(started),
            "partial/carried_in_groups": float(carried),
            "partial/carried_samples": float(len(unfinished)),
            "partial/finished_waiting_groups": float(sum(g.done for g in carry.groups)),
            "partial/dropped_groups": float(len(stale)),
            "async/weight_version": float(gen.meta_info["weight_version"]),
            "async/staleness": float(number - 1 - gen.meta_info["weight_version"]),
        }
        seconds = {"timing_s/gen": generated - start, "timing_s/reward": time.perf_counter() - generated}
        return gen, scored, seconds, metrics

    def round(self, mesh, groups: list[Group], seed: int) -> None:
        """Every unfinished sample of `groups` generates up to rollout.partial_tokens more tokens: new
        groups in one call (rollout.n each), carried samples in one call per token budget (those near
        max_new_tokens have less left), all at once."""
        new = [g for g in groups if not g.samples]
        going = [s for g in groups if g.samples for s in g.samples if not s.done]
        calls: list[tuple[list[Sample], DataProto, int, int, int]] = []  # (samples, prompts, n, budget, seed)
        if new:
            for g in new:
                g.samples = [Sample() for _ in range(self.n)]
            prompts = self.data.batch([g.index for g in new], [g.uid for g in new])
            calls.append(([s for g in new for s in g.samples], prompts, self.n, min(self.budget, self.limit), seed))
        owner = {id(s): g for g in groups for s in g.samples}
        offset = 0
        for budget in sorted({min(self.budget, self.limit - len(s.tokens)) for s in going}):
            part = [s for s in going if min(self.budget, self.limit - len(s.tokens)) == budget]
            calls.append((part, self.continued(part, owner), 1, budget, seed + CARRIED_SEED + offset))
            offset += len(part)
        with (
            mesh.colocated_generation(),
            concurrent.futures.ThreadPoolExecutor(len(calls), thread_name_prefix="meshrl-partial") as pool,
        ):
            futures = [
                pool.submit(mesh.generate, prompts, seed=s, n=n, max_new_tokens=b, colocated=False)
                for _, prompts, n, b, s in calls
            ]
            replies = [f.result() for f in futures]
        for (samples, _, _, budget, _), reply in zip(calls, replies):
            self.extend(samples, reply, budget)

    def continued(self, samples: list[Sample], owner: dict[int, Group]) -> DataProto:
        """Prompts that carry on `samples`: each one's prompt and its tokens so far, left padded."""
        ids = [self.data.prompt_ids[owner[id(s)].index] + s.tokens for s in samples]
        width = max(map(len, ids))
        pad = self.data.pad
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
        return DataProto(
            {
                "input_ids": torch.tensor([[pad] * (width - len(p)) + p for p in ids]),
                "attention_mask": mask,
                "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            }
        )

    def extend(self, samples: list[Sample], reply: DataProto, budget: int) -> None:
        """Each sample's new tokens, log-probs and versions from `reply` (row i: samples[i])."""
        lengths = response_lengths(reply)
        version = int(reply.meta_info.get("weight_version", 0))
        finishes = reply.non_tensor_batch.get("finish_reason")
        for i, (s, length) in enumerate(zip(samples, lengths, strict=True)):
            s.tokens += reply.batch["responses"][i, :length].tolist()
            s.logprobs += reply.batch["rollout_logprobs"][i, :length].tolist()
            versions = reply.batch[VERSIONS][i, :length].tolist() if VERSIONS in reply.batch else [version] * length
            s.versions += versions
            # a rollout that says no finish_reason: one that stopped short of its budget ended
            s.finish = str(finishes[i]) if finishes is not None else ("length" if length >= budget else "stop")
            s.done = s.finish != "length" or len(s.tokens) >= self.limit

    def layout(self, groups: list[Group]) -> DataProto:
        """The step's batch in verl's layout: each group's samples after its prompt, with their tokens'
        versions, and the prompts' columns; its weight_version is the oldest token's."""
        samples = [s for g in groups for s in g.samples]
        pad = self.data.pad
        tensors = rollout_tensors(
            [self.data.prompt_ids[g.index] for g in groups for _ in g.samples],
            [s.tokens for s in samples],
            pad,
            logprobs=[s.logprobs for s in samples],
        )
        width = tensors["responses"].shape[1]
        tensors[VERSIONS] = torch.tensor([s.versions + [0] * (width - len(s.versions)) for s in samples])
        rows = self.data.batch([g.index for g in groups], [g.uid for g in groups])
        columns = {k: object_array(v for v in col for _ in range(self.n)) for k, col in rows.non_tensor_batch.items()}
        columns["response_text"] = object_array(
            self.tokenizer.decode(s.tokens, skip_special_tokens=True) for s in samples
        )
        columns["finish_reason"] = object_array(s.finish for s in samples)
        oldest = min(min(s.versions) for s in samples if s.versions)
        return DataProto(tensors, columns, {"weight_version": oldest, "pad_token_id": pad})
