"""rollout.partial: partial rollouts. A step no longer waits for its longest sample; unfinished samples are
carried into the next step and go on there, on the newer weights, from the tokens they have. What a run
does with them, and what they cannot be combined with, is docs/training.md's "Partial rollouts".

    carry = Partial(cfg, data, tokenizer)                          # the run's (run.state.RunState)
    gen, scored, seconds, metrics = carry.sample(mesh, number, indices, uids, more)
    carry.state_dict() / load_state_dict(...)                      # a checkpoint's (after the step sampled)
    carry.commit()                                                 # the step is done and saved: it stands

A step samples in rounds (fill, round) until data.train_batch_size whole groups are finished, trains on
that many, the oldest first, and carries the rest. A sample is finished when it ends (finish_reason other
than "length") or reaches rollout.max_new_tokens; a carried one is sent again as its prompt and its tokens
so far. Each token keeps the version that produced it and its log-prob under those weights, and a group
whose oldest token is older than s - 1 - trainer.max_staleness is dropped at step s (drop_stale).

Determinism: the rounds' calls carry seeds of the step and the round (a new group's prompt i with
seed + i; carried sample j with seed + j where seed is a hash of the run's seed, the step and the round,
so a sample's pieces never share a random stream), the pool's order is the order groups started, and the
carry is part of each checkpoint, so a resumed run samples what an uninterrupted one does. A step that
fails is done again from the carry it started from, with the prompts it drew from the sampler (replayed),
and with its samples if it had them all (commit() is the run loop's, after the step's checkpoint).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from typing import ClassVar

import torch

from meshrl.dataproto import DataProto, object_array
from meshrl.layout import VERSIONS, prompt_tensors, rollout_tensors
from orchestrator.sampling.episodes import play_all
from orchestrator.sampling.rollouts import StepSampler, StepSamples
from orchestrator.sampling.sampled import sampling_seed, staleness_metrics

log = logging.getLogger(__name__)


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


def carried_seed(seed: int, number: int, round: int) -> int:
    """The seed of a round's carried samples (sample j: + j): a hash, so that no shift of steps, rounds
    and rows gives one sample's next piece the stream of its last."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{number}/{round}".encode(), digest_size=4).digest(), "little")


def to_state(carry: Carry) -> dict:
    """The carry as a checkpoint holds it: its structure (JSON) and its samples' tokens, log-probs and
    versions as three flat tensors ("tensors", one file), each sample's `length` long in turn."""
    samples = [s for g in carry.groups for s in g.samples]
    flat = lambda key, dtype: torch.tensor([x for s in samples for x in getattr(s, key)], dtype=dtype)  # noqa: E731
    return {
        "queue": [list(q) for q in carry.queue],
        "groups": [
            {
                "index": g.index,
                "uid": g.uid,
                "samples": [{"length": len(s.tokens), "finish": s.finish, "done": s.done} for s in g.samples],
            }
            for g in carry.groups
        ],
        "tensors": {
            "tokens": flat("tokens", torch.int64),
            "logprobs": flat("logprobs", torch.float32),
            "versions": flat("versions", torch.int64),
        },
    }


def from_state(state: dict) -> Carry:
    t = state["tensors"]
    tokens, logprobs, versions = t["tokens"].tolist(), t["logprobs"].tolist(), t["versions"].tolist()
    at, groups = 0, []
    for g in state["groups"]:
        samples = []
        for s in g["samples"]:
            end = at + s["length"]
            samples.append(Sample(tokens[at:end], logprobs[at:end], versions[at:end], s["finish"], s["done"]))
            at = end
        groups.append(Group(int(g["index"]), str(g["uid"]), samples))
    if at != len(tokens):
        raise ValueError(f"the partial rollouts' carry holds {len(tokens)} tokens and its samples name {at}")
    return Carry([(int(i), str(u)) for i, u in state["queue"]], groups)


EPISODES = "{key}: plays multi-turn or agent episodes, which are not carried between steps"
SYNCHRONOUS = (
    "rollout.partial carries samples between steps of {loops}; {algorithm} does not sample them: set it to false"
)


class Partial(StepSampler):
    """The run's carry of unfinished samples, and the step sampler that samples in rounds from it."""

    refuses: ClassVar[dict[str, str]] = {
        "environment episodes": EPISODES,
        "agent episodes": EPISODES,
        "dynamic sampling": "{key}: algorithm.dynamic_sampling samples rounds of its own",
        "chunks": "{key}: rollout.chunks: a round's calls already go out at once (set it to 1)",
        "rollout experts": "{key}: routing replay R3 records experts per call, which carried samples lack",
        "colocate": "{key}: rollout.colocate: a step's rounds would hand the GPU over each round",
        "updates in flight": (
            "{key}: rollout.on_update={cfg.rollout.on_update} is for pushes during a generation, and partial "
            "rollouts push between steps (keep would only turn vLLM's prefix cache off): leave it at wait"
        ),
        "dpo": SYNCHRONOUS,
        "sft": SYNCHRONOUS,
    }

    def __init__(self, cfg, data, tokenizer):
        self.cfg, self.data, self.tokenizer = cfg, data, tokenizer
        r = cfg.rollout
        self.n, self.limit = r.n, r.max_new_tokens
        self.budget = r.partial_tokens or max(1, r.max_new_tokens // 4)
        self.groups = cfg.data.train_batch_size
        self.staleness = cfg.trainer.max_staleness
        self.carry = Carry()  # after the last step done
        self.pending: Carry | None = None  # after the step being done, once it sampled
        # the step being done: its number, the batches it drew from the sampler (a retry replays them), and
        # what it sampled once it had it all (a retry after that takes it)
        self.attempt: dict = {"number": None, "drawn": [], "result": None}

    # ---- the run loop's side --------------------------------------------------------------

    def commit(self) -> None:
        if self.pending is not None:
            self.carry, self.pending = self.pending, None
        self.attempt = {"number": None, "drawn": [], "result": None}

    def state_dict(self) -> dict:
        """The carry after the step being done once it sampled (what its checkpoint holds), else the last
        committed one."""
        return to_state(self.pending if self.pending is not None else self.carry)

    def load_state_dict(self, state: dict) -> None:
        carry = from_state(state)
        for g in carry.groups:
            if g.samples and len(g.samples) != self.n:
                raise ValueError(
                    f"the checkpoint's partial rollouts carry groups of {len(g.samples)} samples and rollout.n is "
                    f"{self.n}: resume with rollout.n={len(g.samples)}"
                )
            longest = max((len(s.tokens) for s in g.samples), default=0)
            if longest > self.limit:
                raise ValueError(
                    f"the checkpoint's partial rollouts carry a sample of {longest} tokens, more than "
                    f"rollout.max_new_tokens={self.limit}: resume with rollout.max_new_tokens >= {longest}"
                )
        self.carry, self.pending = carry, None
        self.attempt = {"number": None, "drawn": [], "result": None}

    # ---- a step ----------------------------------------------------------------------------

    def sample(
        self, mesh, number: int, indices: list[int], uids: list[str], more: Callable[[], tuple] | None
    ) -> StepSamples:
        """Step `number`'s (gen, scored, timing_s/{gen,reward}, partial/* metrics): its batch (indices,
        uids) joins the queue of prompts to start, and rounds are sampled until the step has its groups."""
        attempt = self.attempt
        if attempt["number"] != number:
            attempt = self.attempt = {"number": number, "drawn": [], "result": None}
        elif attempt["result"] is not None:  # the step failed after it sampled: done again on those samples
            gen, scored, seconds, metrics, self.pending = attempt["result"]
            return gen, scored, seconds, metrics
        replay = iter(list(attempt["drawn"]))

        def draw() -> tuple:  # what the failed attempt drew first, then the sampler's next
            batch = next(replay, None)
            if batch is None:
                if more is None:
                    raise RuntimeError("partial rollouts ran out of prompts to start")
                batch = more()
                attempt["drawn"].append(batch)
            return batch

        carry = copy.deepcopy(self.carry)
        carry.queue.extend(zip(indices, uids))
        stale = self.drop_stale(carry, number)
        carried, start = len(carry.groups), time.perf_counter()
        rounds = self.fill(mesh, carry, number, draw)
        for batch in replay:  # drawn by the failed attempt and not needed now: started later, not lost
            carry.queue.extend(zip(*batch))
        started = len(carry.groups) - carried
        generated = time.perf_counter()
        ready = sorted((g for g in carry.groups if g.done), key=lambda g: g.oldest or 0)  # stable: in start order
        take = ready[: self.groups]
        carry.groups = [g for g in carry.groups if not any(g is t for t in take)]
        gen = self.layout(take)
        scored = mesh.score(gen)
        unfinished = [s for g in carry.groups for s in g.samples if not s.done]
        metrics = {
            "partial/rounds": float(rounds),
            "partial/started_groups": float(started),
            "partial/carried_in_groups": float(carried),
            "partial/carried_samples": float(len(unfinished)),
            "partial/finished_waiting_groups": float(sum(g.done for g in carry.groups)),
            "partial/dropped_groups": float(len(stale)),
            **staleness_metrics(number, gen.meta_info["weight_version"]),
        }
        seconds = {"timing_s/gen": generated - start, "timing_s/reward": time.perf_counter() - generated}
        self.pending = carry
        attempt["result"] = (gen, scored, seconds, metrics, carry)
        return gen, scored, seconds, metrics

    def drop_stale(self, carry, number: int) -> list[Group]:
        """The carried groups begun on weights older than step `number` may train on, taken out of `carry`."""
        floor = number - 1 - self.staleness  # the oldest version step `number` may train on
        stale = [g for g in carry.groups if (g.oldest if g.oldest is not None else floor) < floor]
        carry.groups = [g for g in carry.groups if not any(g is s for s in stale)]
        if stale:
            log.warning(
                "step %d: %d carried group(s) began on weights older than trainer.max_staleness=%d allows and "
                "were dropped unfinished (more rollout.partial_tokens or a larger max_staleness keeps them)",
                number,
                len(stale),
                self.staleness,
            )
        return stale

    def fill(self, mesh, carry, number: int, draw: Callable[[], tuple]) -> int:
        """Rounds until `carry` holds the step's finished groups, new ones started from the queue (drawn
        from the sampler as it runs short); how many rounds it took."""
        rounds = 0
        while sum(g.done for g in carry.groups) < self.groups:
            fresh = max(0, self.groups - sum(not g.done for g in carry.groups))
            while len(carry.queue) < fresh:
                carry.queue.extend(zip(*draw()))
            carry.groups += [Group(i, u) for i, u in carry.queue[:fresh]]
            carry.queue = carry.queue[fresh:]
            self.round(mesh, carry.groups, number, rounds)
            rounds += 1
        return rounds

    def round(self, mesh, groups: list[Group], number: int, round: int) -> None:
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
            seed = sampling_seed(self.cfg, number, round)
            calls.append(([s for g in new for s in g.samples], prompts, self.n, min(self.budget, self.limit), seed))
        owner = {id(s): g for g in groups for s in g.samples}
        seed = carried_seed(self.cfg.trainer.seed, number, round)
        budgets = {id(s): min(self.budget, self.limit - len(s.tokens)) for s in going}
        for budget in sorted(set(budgets.values())):
            part = [s for s in going if budgets[id(s)] == budget]
            ids = [self.data.prompt_ids[owner[id(s)].index] + s.tokens for s in part]
            calls.append((part, DataProto(prompt_tensors(ids, self.data.pad)), 1, budget, seed))
            seed += len(part)
        jobs = [
            functools.partial(mesh.generate, prompts, seed=s, n=n, max_new_tokens=b, colocated=False)
            for _, prompts, n, b, s in calls
        ]
        replies = play_all(mesh, jobs, "meshrl-partial", workers=len(calls))  # all at once
        for (samples, _, _, budget, _), reply in zip(calls, replies):
            self.extend(samples, reply, budget)

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
            versions=[s.versions for s in samples],
        )
        rows = self.data.batch([g.index for g in groups], [g.uid for g in groups])
        columns = {k: object_array(v for v in col for _ in range(self.n)) for k, col in rows.non_tensor_batch.items()}
        columns["response_text"] = object_array(
            self.tokenizer.decode(s.tokens, skip_special_tokens=True) for s in samples
        )
        columns["finish_reason"] = object_array(s.finish for s in samples)
        oldest = min(min(s.versions) for s in samples if s.versions)
        return DataProto(tensors, columns, {"weight_version": oldest, "pad_token_id": pad})
