"""The roles on top of an engine: actor (log-probs; PPO, DPO, SFT updates), ref (frozen log-probs)
and critic (values; clipped value loss). Each runs on every rank with that rank's part of the batch.

Loss weights make the accumulated gradient equal to that of the mini-batch loss
over all ranks: a micro-batch's loss (a mean over its own tokens or sequences)
is weighted by its share of the mini-batch's tokens or sequences, times the
world size, since FSDP averages gradients over ranks.
"""

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist

from meshrl import seeds
from meshrl.algos import router_replay
from meshrl.algos.losses import (
    dpo_loss,
    kl_loss,
    sft_loss,
    value_loss,
)
from meshrl.algos.masked import agg_loss
from meshrl.algos.moe import RouterCapture, router_terms, routers
from meshrl.algos.policy_losses import policy_loss
from meshrl.algos.rollout_correction import kl_to_actor, rollout_is_weights, rollout_rejection_mask
from meshrl.config.losses import UPDATE_LOSSES, Schedule
from meshrl.dataproto import DataProto
from meshrl.modalities import ROW_TENSORS
from services.actor import sequence
from services.actor.batches import BASE, micro_batches, minibatches, num_minibatches, restore, token_groups, trimmed
from services.actor.comm import Cancelled
from services.actor.engine import Engine
from services.actor.head import response_logprobs
from services.actor.model import forward_response, record_routing

OLD = "old_logprobs"  # an update's own old log-probs (ActorRole.with_old_logprobs)
IS_WEIGHTS = "rollout_is_weights"  # weights reject() computed over the response before rejection


def is_weights(old, rollout, mask, p) -> tuple[torch.Tensor, dict[str, float]]:
    """The rollout correction's importance weights with the update's settings (algorithm.rollout_is*)."""
    return rollout_is_weights(
        old, rollout, mask, p.rollout_is, p.rollout_is_cap, mode=p.rollout_is_mode, floor=p.rollout_is_floor
    )


def reject(part: DataProto, p, old_key: str) -> dict[str, float]:
    """Rejection sampling before the update (verl's way): the rejected tokens leave part's response_mask, so
    every micro-batch's share of the mini-batch counts only what stays. Importance weights, if any, are
    taken first, over the whole response (a sequence or geometric weight spans its rejected tokens too).
    Returns the shares rejected over all ranks."""
    mask, rollout = part.batch["response_mask"], part.batch["rollout_logprobs"]
    old = part.batch[old_key]
    sums = [0.0, 0.0]
    if p.rollout_is != "none":
        part.batch[IS_WEIGHTS], m = is_weights(old, rollout, mask, p)
        share = next(k for k in m if k.endswith("_frac"))  # capped (truncate) or masked (mask)
        sums = [m["actor/rollout_is_mean"] * float(mask.sum()), float(mask.sum()), m[share] * float(mask.sum())]
    keep, _ = rollout_rejection_mask(old, rollout, mask, p.rollout_rs, p.rollout_rs_threshold)
    valid, rows = mask > 0, mask.sum(-1) > 0
    out_rows = (valid & (keep == 0)).any(-1) & rows
    counts = [float((valid & (keep == 0)).sum()), float(valid.sum()), float(out_rows.sum()), float(rows.sum())]
    part.batch["response_mask"] = mask * keep
    total = all_reduce_sum(counts + sums)
    metrics = {
        "actor/rollout_rs_masked_frac": total[0] / max(total[1], 1.0),
        "actor/rollout_rs_seq_masked_frac": total[2] / max(total[3], 1.0),
    }
    if p.rollout_is != "none":  # token-weighted over the ranks
        metrics["actor/rollout_is_mean"] = total[4] / max(total[5], 1.0)
        metrics[share] = total[6] / max(total[5], 1.0)
    return metrics


def all_reduce_sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_min(value: int) -> int:
    t = torch.tensor([value])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def split(engine: Engine, part: DataProto, keys: tuple[str, ...], unit: int = 1):
    """This rank's micro-batches of `part` and the rows each holds (None: consecutive rows, full width).

    With a token budget the ranks agree on the count first: an FSDP forward is collective, so every
    rank must run as many as the others."""
    cfg = engine.cfg
    if cfg.micro_batch_tokens <= 0:
        return micro_batches(part, max(unit, cfg.micro_batch_size // unit * unit), keys), None
    shared = cfg.share_prompts and engine.kind == "causal"
    groups = token_groups(part, cfg.micro_batch_tokens, unit, shared=shared, packed=cfg.padding_free)
    count = torch.tensor([len(groups)])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    if int(count) > len(groups):
        groups = token_groups(part, cfg.micro_batch_tokens, unit, int(count), shared, cfg.padding_free)
    return [trimmed(part, g, keys) for g in groups], groups


def forward_rows(engine: Engine, part: DataProto, fn) -> list[torch.Tensor]:
    """fn(model, micro) -> a tensor or a tuple of tensors (rows, T_micro, ...) for each micro-batch,
    put back in the part's row order at its full response width: one tensor per output. Experts to
    replay (router_replay.ROUTED) go with the rows."""
    keys = (*BASE, *(k for k in (router_replay.ROUTED, *ROW_TENSORS) if k in part.batch))  # experts, pictures
    micros, groups = split(engine, part, keys)
    outs = [o if isinstance(o, tuple) else (o,) for o in engine.forward(micros, fn)]
    T = part.batch["responses"].shape[1]
    if groups is None:
        return [torch.cat([o[i] for o in outs]).cpu() for i in range(len(outs[0]))]
    return [restore([o[i].cpu() for o in outs], groups, T) for i in range(len(outs[0]))]


def routing_rows(engine: Engine, part: DataProto) -> torch.Tensor:
    """(rows, sequence, layers, k): the experts the routers choose for every token of the part, each
    micro-batch's columns put back where its rows' prompts and responses sit (router_replay.ROUTED)."""
    micros, groups = split(engine, part, BASE)
    outs = engine.forward(micros, record_routing)
    ids, T = part.batch["input_ids"], part.batch["responses"].shape[1]
    P = ids.shape[1] - T
    full = router_replay.filler((*ids.shape, *outs[0].shape[2:-1]), outs[0].shape[-1], outs[0].dtype)
    start = 0
    for i, (micro, out) in enumerate(zip(micros, outs)):
        rows = groups[i] if groups is not None else torch.arange(start, start + len(out))
        start += len(out)
        prompt = out.shape[1] - micro["responses"].shape[1]  # the micro-batch's own prompt width
        full[rows, P - prompt : P - prompt + out.shape[1]] = out.cpu()
    return full


def loss_units(mode: str) -> Callable[[dict], float]:
    """What a loss with this aggregation averages over in a micro-batch: its valid tokens (token-mean) or
    its sequences with any token."""

    def units(mb: dict) -> float:
        mask = mb["response_mask"]
        return float(mask.sum() if mode == "token-mean" else (mask.sum(-1) > 0).sum())

    return units


class MetricSum:
    """Weighted sums of metrics over micro-batches and ranks, averaged over optimizer steps."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.steps = 0

    def add_step(self, weighted: list[tuple[float, dict]], step_stats: dict, prefix: str) -> None:
        keys = sorted({k for _, m in weighted for k in m})
        totals = all_reduce_sum([sum(w * m.get(k, 0.0) for w, m in weighted) for k in keys]) if keys else []
        for k, v in zip(keys, totals):
            self.sums[k] = self.sums.get(k, 0.0) + v
        for k in ("grad_norm", "lr"):
            self.sums[f"{prefix}/{k}"] = self.sums.get(f"{prefix}/{k}", 0.0) + step_stats[k]
        self.sums[f"{prefix}/skipped_steps"] = self.sums.get(f"{prefix}/skipped_steps", 0.0) + step_stats["skipped"]
        self.steps += 1

    def result(self, prefix: str) -> dict[str, float]:
        out = {k: v / self.steps for k, v in self.sums.items() if not k.endswith("skipped_steps")}
        out[f"{prefix}/skipped_steps"] = self.sums.get(f"{prefix}/skipped_steps", 0.0)
        out[f"{prefix}/num_optimizer_steps"] = float(self.steps)
        return out


@dataclasses.dataclass
class Pass:
    """One update's walk over this rank's part: epochs of mini-batches (schedule) over total_rows rows on
    all ranks, loss_fn(model, micro) -> (loss, metrics) on each micro-batch, units_fn(micro) what its loss
    averages over, unit rows kept together (DPO's pairs), metrics under prefix. own_first: the first
    mini-batch goes without the OLD column (its loss takes its own pass's log-probs, see with_old_logprobs).
    Every tensor of the part goes to the micro-batches: the servicer sent what the loss reads."""

    part: DataProto
    schedule: Schedule
    total_rows: int
    step: int
    prefix: str
    loss_fn: Callable
    units_fn: Callable
    unit: int = 1
    own_first: bool = False


def train(engine: Engine, job: Pass) -> dict[str, float]:
    """Epochs of mini-batches over this rank's part; one optimizer step per mini-batch. Cancelled (every
    rank at the same micro-batch) drops the unfinished mini-batch's gradients and says how many optimizer
    steps were taken before it."""
    metrics = MetricSum()
    try:
        _train(engine, job, metrics)
    except Cancelled as e:
        engine.drop_gradients()
        planned = job.schedule.ppo_epochs * num_minibatches(job.total_rows, job.schedule.mini_batch_size)
        raise Cancelled(
            f"{e} after {metrics.steps} of {planned} optimizer steps",
            {"optimizer_steps": metrics.steps, "planned_steps": planned},
        ) from None
    engine.end_update()
    return metrics.result(job.prefix)


def epoch_order(part: DataProto, p, step: int, epoch: int, unit: int = 1) -> torch.Tensor:
    """The rows of an epoch in order: as sent, or (shuffle) a seeded permutation keeping units together."""
    if not p.shuffle:
        return torch.arange(len(part))
    g = torch.Generator().manual_seed(p.seed + 1000 * step + epoch)
    order = torch.randperm(len(part) // unit, generator=g)
    return (order[:, None] * unit + torch.arange(unit)).flatten()


def _train(engine: Engine, job: Pass, metrics: MetricSum) -> None:
    world, p, keys = dist.get_world_size(), job.schedule, tuple(job.part.batch)
    count = num_minibatches(job.total_rows, p.mini_batch_size)
    # one mini-batch a pass: its order changes no gradient, only how the micro-batches sum, so it is kept
    shuffled = p.shuffle and count > 1
    for epoch in range(p.ppo_epochs):
        data = job.part.select_idxs(epoch_order(job.part, p, job.step, epoch, job.unit)) if shuffled else job.part
        for i, mini in enumerate(minibatches(data, count, job.unit)):
            first = job.own_first and epoch == 0 and i == 0
            micros, _ = split(engine, mini, tuple(k for k in keys if k != OLD) if first else keys, job.unit)
            local = [job.units_fn(mb) for mb in micros]
            total = all_reduce_sum([sum(local)])[0]
            shares = [u / total if total else 0.0 for u in local]
            micro_metrics = engine.forward_backward(micros, job.loss_fn, [s * world for s in shares])
            metrics.add_step(list(zip(shares, micro_metrics)), engine.step(), job.prefix)


class PolicyRole:
    """Log-probs of the responses under the policy; ref uses it as is."""

    output_key = "ref_logprobs"

    def __init__(self, engine: Engine):
        self.engine = engine
        self.shared = engine.cfg.share_prompts  # a causal LM: see model.forward_response

    def logprobs(
        self, part: DataProto, temperature: float, with_entropy: bool, without_adapter: bool = False
    ) -> DataProto:
        """without_adapter (an engine with a LoRA adapter): the base model's log-probs, as ref_logprobs."""

        def fn(model, mb):
            lp, entropy = response_logprobs(model, mb, temperature, share_prompts=self.shared, entropy=with_entropy)
            return (lp, entropy) if with_entropy else lp

        if not without_adapter:
            return DataProto(dict(zip((self.output_key, "entropy"), forward_rows(self.engine, part, fn))))
        with self.engine.adapter_disabled():
            return DataProto(dict(zip((PolicyRole.output_key, "entropy"), forward_rows(self.engine, part, fn))))


class ActorRole(PolicyRole):
    output_key = "actor_logprobs"

    def with_old_logprobs(
        self, part: DataProto, p, total_rows: int, step: int, every_row: bool = False
    ) -> tuple[DataProto, bool]:
        """An update that finds its own old log-probs (old_logprobs_key empty), saving the caller a pass:
        the first mini-batch of a one-epoch update takes its own pass's (the weights are still the old
        ones then) and every other row gets them from a pass without gradients before the first optimizer
        step, in the OLD column. Returns the part and whether the first mini-batch goes without OLD. One
        mini-batch and one epoch: no such pass at all. More epochs: the pass covers every row, since later
        epochs see the first mini-batch's rows again. every_row: the pass covers every row whatever the
        schedule (rejection sampling decides on every row before the update starts)."""
        count = num_minibatches(total_rows, p.mini_batch_size)
        if p.ppo_epochs == 1 and count == 1 and not every_row:
            return part, True
        order = epoch_order(part, p, step, 0)
        rest = order[len(minibatches(part, count)[0]) :]  # the first's size does not depend on the order
        # the pass is collective: all ranks or none
        own_first = p.ppo_epochs == 1 and not every_row and all_reduce_min(len(rest)) > 0
        rows = rest if own_first else order
        old = torch.zeros(part.batch["responses"].shape, dtype=torch.float32)
        old[rows] = self.logprobs(part.select_idxs(rows), p.temperature, False).batch[self.output_key].float()
        part.batch[OLD] = old
        return part, own_first

    def with_routing(self, part: DataProto, p, total_rows: int) -> DataProto:
        """R2 (router_replay=r2, a mixture of experts): every row's routing on the weights before the
        update, in ROUTED, which the update's passes then replay; none where the update is one mini-batch
        of one epoch (its one pass routes on those weights anyway)."""
        once = p.ppo_epochs == 1 and num_minibatches(total_rows, p.mini_batch_size) == 1
        if p.replay.own_first_pass and not once and routers(self.engine.module):
            part.batch[router_replay.ROUTED] = routing_rows(self.engine, part)
        return part

    def update_ppo(self, part: DataProto, p, total_rows: int, step: int) -> dict[str, float]:
        """With the rollout's experts and router_replay off (router_agreement), every pass routes afresh and
        only counts how often it routes as the rollout did."""
        replay = router_replay.replay_of(self.engine.module) if router_replay.ROUTED in part.batch else None
        if replay is None:
            return self._update_ppo(part, p, total_rows, step)
        replay.observe = p.replay.afresh
        try:
            return self._update_ppo(part, p, total_rows, step)
        finally:
            replay.observe = False

    def _update_ppo(self, part: DataProto, p, total_rows: int, step: int) -> dict[str, float]:
        own_first = False
        part = self.with_routing(part, p, total_rows)
        if not p.old_logprobs_key:
            part, own_first = self.with_old_logprobs(part, p, total_rows, step, every_row=bool(p.rollout_rs))
        old_key = p.old_logprobs_key or OLD
        rejected = reject(part, p, old_key) if p.rollout_rs else {}
        if p.replay.rollouts and p.router_agreement and "rollout_logprobs" in part.batch:
            rejected |= self.kl_afresh(part, p)
        rng = torch.Generator().manual_seed(seeds.step_seed(p.seed, step))  # clip_cov's picks, the same on resume
        shards = sequence.of(self.engine.module)  # split passes: the router losses read the whole row
        capture = RouterCapture(self.engine.module, shards.whole if shards is not None else None)
        replay = router_replay.replay_of(self.engine.module) if router_replay.ROUTED in part.batch else None
        if replay is not None:
            replay.agreement()  # counted from this update's passes on (not the log-prob calls before it)

        def ppo(model, mb):
            capture.clear()
            lp, token_entropy = response_logprobs(
                model, mb, p.temperature, share_prompts=self.shared, entropy=bool(p.entropy_coeff)
            )
            mask = mb["response_mask"]
            # none sent for these rows (with_old_logprobs): this pass's own, without their gradient
            old = mb[old_key] if old_key in mb else lp.detach()
            weights: torch.Tensor | None = mb.get(IS_WEIGHTS)  # reject() weighed them before it rejected
            m: dict[str, float] = {}
            if p.rollout_is != "none" and weights is None:
                weights, wm = is_weights(old, mb["rollout_logprobs"], mask, p)
                m.update(wm)
            total, pm = policy_loss(p, lp, old, mb["advantages"], mask, weights=weights, generator=rng)
            m.update(pm)
            if not p.old_logprobs_key and "rollout_logprobs" in mb:
                m["rollout/kl_to_actor"] = kl_to_actor(mb["rollout_logprobs"], old, mask)
            if token_entropy is not None:
                entropy = agg_loss(token_entropy, mask, p.loss_agg_mode)
                total = total - p.entropy_coeff * entropy
                m["actor/entropy"] = entropy.item()
            if p.use_kl_loss:
                kl, km = kl_loss(lp, mb["ref_logprobs"], mask, p.kl_loss_type, p.loss_agg_mode)
                total = total + p.kl_loss_coef * kl
                m.update(km)
            router, rm = router_terms(capture, p.router_aux_loss_coef, p.router_z_loss_coef)
            m.update(rm)
            if replay is not None:
                m.update(replay.agreement())
            return total + router, m

        job = Pass(part, p, total_rows, step, "actor", ppo, loss_units(p.loss_agg_mode), own_first=own_first)
        with capture:
            return rejected | train(self.engine, job)

    def kl_afresh(self, part: DataProto, p) -> dict[str, float]:
        """R3 with router_agreement: rollout/kl_to_actor as it would be without replay, from a pass without
        gradients that routes every row afresh on the weights before the update (token-weighted over the
        ranks), beside the replayed rollout/kl_to_actor of the update's own passes."""
        rows = part.select(batch_keys=[k for k in part.batch.keys() if k != router_replay.ROUTED])
        mask, rollout = part.batch["response_mask"], part.batch["rollout_logprobs"]
        afresh = self.logprobs(rows, p.temperature, False).batch[self.output_key].float()
        tokens = float(mask.sum())
        total, count = all_reduce_sum([kl_to_actor(rollout, afresh, mask) * tokens, tokens])
        return {"rollout/kl_to_actor_afresh": total / max(count, 1.0)}

    def update_sft(self, part: DataProto, p, total_rows: int, step: int) -> dict[str, float]:
        def sft(model, mb):
            lp, _ = response_logprobs(model, mb, share_prompts=self.shared)
            return sft_loss(lp, mb["response_mask"], p.loss_agg_mode)

        return train(self.engine, Pass(part, p, total_rows, step, "actor", sft, loss_units(p.loss_agg_mode)))

    def update_dpo(self, part: DataProto, p, total_rows: int, step: int) -> dict[str, float]:
        def dpo(model, mb):
            return self._dpo(model, mb, p, self.shared)

        return train(self.engine, Pass(part, p, total_rows, step, "actor", dpo, _valid_pairs, unit=2))

    UPDATES = {"ppo": update_ppo, "sft": update_sft, "dpo": update_dpo}

    def update(self, part: DataProto, loss: str, p, total_rows: int, step: int) -> dict[str, float]:
        return self.UPDATES[loss](self, part, p, total_rows, step)

    @staticmethod
    def _dpo(model, mb, p, shared: bool):
        """Rows alternate chosen, rejected; pairs where either response is empty (padding) are left out."""
        mask = mb["response_mask"]
        seq = (response_logprobs(model, mb, p.temperature, share_prompts=shared)[0] * mask).sum(-1)
        ref = (mb["ref_logprobs"] * mask).sum(-1)
        valid = _pair_mask(mask)
        if not valid.any():
            return seq.sum() * 0.0, {}  # keeps every rank's backward in step
        return dpo_loss(
            seq[0::2][valid],
            seq[1::2][valid],
            ref[0::2][valid],
            ref[1::2][valid],
            beta=p.beta,
            loss_type=p.loss_type,
            label_smoothing=p.label_smoothing,
        )


def _pair_mask(mask: torch.Tensor) -> torch.Tensor:
    has = mask.sum(-1) > 0
    return has[0::2] & has[1::2]


def _valid_pairs(mb: dict) -> float:
    return float(_pair_mask(mb["response_mask"]).sum())


class CriticRole:
    output_key = "values"

    def __init__(self, engine: Engine):
        self.engine = engine

    def values(self, part: DataProto) -> DataProto:
        (values,) = forward_rows(self.engine, part, lambda model, mb: forward_response(model, mb)[..., 0].float())
        return DataProto({"values": values})

    def update_value(self, part: DataProto, p, total_rows: int, step: int) -> dict[str, float]:
        def vf(model, mb):
            vpred = forward_response(model, mb)[..., 0].float()
            mask = mb["response_mask"]
            total, m = value_loss(vpred, mb["values"], mb["returns"], mask, p.clip_range_value, p.loss_agg_mode)
            m["critic/vpred_mean"] = (vpred * mask).sum().item() / max(1.0, mask.sum().item())
            return total, m

        return train(self.engine, Pass(part, p, total_rows, step, "critic", vf, loss_units(p.loss_agg_mode)))

    UPDATES = {"value": update_value}

    def update(self, part: DataProto, loss: str, p, total_rows: int, step: int) -> dict[str, float]:
        return self.UPDATES[loss](self, part, p, total_rows, step)


ROLES: dict[str, type[PolicyRole] | type[CriticRole]] = {"actor": ActorRole, "ref": PolicyRole, "critic": CriticRole}
KIND = {"actor": "causal", "ref": "causal", "critic": "value"}
for _name, _role in ROLES.items():  # each loss of the table (meshrl/config/losses.py) has its update in its role
    assert getattr(_role, "UPDATES", {}).keys() == {n for n, u in UPDATE_LOSSES.items() if u.role == _name}, _name
