"""PPO, GRPO, RLOO and REINFORCE++: one step, differing in the advantage estimator and the critic.

    generate n responses per prompt -> score -> old (and ref) log-probs -> [critic values]
    -> token rewards (score, minus the KL penalty if use_kl_in_reward) -> advantages
    -> [critic update] -> actor update (clipped PPO objective) -> push weights

- PPO (Schulman et al. 2017, arXiv:1707.06347): GAE over the critic's values (Ouyang et al. 2022 for RLHF).
- GRPO (Shao et al. 2024, arXiv:2402.03300): group-normalised scores; Dr.GRPO with norm_adv_by_std=false.
- RLOO (Ahmadian et al. 2024, arXiv:2402.14740): leave-one-out baseline within the group.
- REINFORCE++ (Hu 2025, arXiv:2501.03262): batch-whitened returns; `reinforce_plus_plus_baseline` too.
- On-policy distillation (meshrl.algos.distill): with a teacher (teacher.model or teacher.address) every
  loop adds algorithm.distill_coef x (the teacher's log-prob - the sampler's) to each token's advantage;
  `meshrl opd` trains on that term alone, the task's scores only logged.
"""

import dataclasses
import logging

import torch

from meshrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs
from meshrl.algos.distill import distillation_advantages
from meshrl.algos.kl import FixedKLController, KLController, apply_kl_penalty, kl_controller
from meshrl.algos.masked import masked_mean, token_level
from meshrl.algos.rollout_correction import kl_to_actor
from meshrl.algos.router_replay import ROUTED
from meshrl.algos.shaping import overlong_penalty
from meshrl.dataproto import DataProto
from meshrl.layout import VERSIONS
from orchestrator.config import Config
from orchestrator.lifecycle.mesh import POLICY_TENSORS, Mesh
from orchestrator.loops.params import ppo_params, value_params
from orchestrator.output.readings import score_metrics
from orchestrator.sampling import combinations
from orchestrator.sampling.rollouts import Rollouts
from orchestrator.timer import Timer

log = logging.getLogger(__name__)
# estimators whose only baseline is the prompt's other samples (REINFORCE++-baseline still whitens over the batch)
GROUP_BASELINES = ("grpo", "rloo")


def own_old_logprobs(cfg: Config) -> bool:
    """The actor's update finds its old log-probs itself (PPOParams.old_logprobs_key empty: the first
    mini-batch's from its own pass, the others' from a pass inside the update), so the step makes no
    log-prob call before it; unless something needs them first (a KL penalty in the reward)."""
    return cfg.actor.reuse_logprobs and not cfg.algorithm.use_kl_in_reward


def response_limit(cfg: Config) -> int:
    """The tokens a response may have: rollout.max_new_tokens, or a multi-turn episode's whole budget."""
    return cfg.rollout.response_budget


def clip_ratio(gen, limit: int) -> float:
    """The share of responses cut off by the generation limit: `limit` tokens long (observations included)
    and not ended by the model (finish_reason "stop", where the rollout says). Not against the batch's
    longest response, which the responses are only padded to: short ones all "clipped" then."""
    width = gen.batch["responses"].shape[1]
    lengths = gen.batch["attention_mask"][:, -width:].sum(-1)  # (B,) response tokens, padding excluded
    clipped = lengths >= limit
    finish = gen.non_tensor_batch.get("finish_reason")
    if finish is not None:  # an end token as the limit's last token is a finished response
        clipped &= torch.tensor([f != "stop" for f in finish], dtype=torch.bool)
    return clipped.float().mean().item()


def warn_if_flat(scores: torch.Tensor, number: int) -> None:
    """The run's first step with every sample scored the same: no sample is better than another, so the
    step learns nothing. Often the scorer lacks what it needs (every score 0: an empty ground truth)."""
    if len(scores) > 1 and bool((scores == scores[0]).all()):
        log.warning(
            "step %d: ALL %d samples scored %g, so the advantages carry no signal and the step learns nothing; "
            "unless the task is that easy or hard, check what the scorer sees (samples.jsonl: each sample's "
            "ground_truth and reward_status; data.answer_key names the answers' column)",
            number,
            len(scores),
            scores[0].item(),
        )


def rollout_metrics(gen, scored, batch, advantages, limit: int) -> dict[str, float]:
    mask = batch.batch["response_mask"]
    lengths = mask.sum(-1).float()
    out = {
        **score_metrics(scored),
        "critic/advantages/mean": masked_mean(advantages, mask).item(),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/clip_ratio": clip_ratio(gen, limit),
    }
    if "actor_logprobs" in batch.batch:  # else the update reported it from its own pass
        # how far the rollout's sampling distribution is from the actor's: ~0 when the push worked
        out["rollout/kl_to_actor"] = kl_to_actor(gen.batch["rollout_logprobs"], batch.batch["actor_logprobs"], mask)
    if VERSIONS in gen.batch:  # rollout.on_update=keep: pushes went in between a generation's steps
        spans = versions_spanned(gen.batch[VERSIONS], gen.batch["response_mask"])
        out["rollout/versions_per_sample/mean"] = spans.mean().item()
        out["rollout/versions_per_sample/max"] = spans.max().item()
    return out


def versions_spanned(versions: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(rows,) how many weight versions produced each response's tokens (versions only grow along one)."""
    real = response_mask > 0
    return (((versions[:, 1:] != versions[:, :-1]) & real[:, 1:]).sum(-1) + 1).float()


@dataclasses.dataclass
class PolicyGradient:
    name: str
    estimator: str  # default; algorithm.adv_estimator overrides
    critic: bool = False
    distill_only: bool = False  # opd: the teacher's term is the whole advantage (no estimator, no reward)
    # the config's is made by setup(); its coefficient is part of a checkpoint
    kl_ctrl: KLController = dataclasses.field(default_factory=lambda: FixedKLController(0.0))
    scores_checked: bool = False  # the first step's scores were looked at (warn_if_flat: once a run)

    @property
    def trained(self) -> tuple[str, ...]:
        return ("actor", "critic") if self.critic else ("actor",)

    def setup(self, cfg: Config) -> set[str]:
        combinations.check(cfg, self.name)  # the ways of sampling the config turns on go together
        needs_ref = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        al = cfg.algorithm
        self.kl_ctrl = kl_controller(al.kl_ctrl, al.kl_coef, al.kl_target, al.kl_horizon)
        estimator = cfg.algorithm.adv_estimator or self.estimator
        if estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"algorithm.adv_estimator must be one of {sorted(ADVANTAGE_ESTIMATORS)}, got {estimator!r}"
            )
        if self.distill_only and not cfg.teacher.given:
            raise ValueError(
                f"meshrl {self.name} needs a teacher: teacher.model=FOLDER (a model with the student's tokenizer) "
                "or teacher.address=HOST:PORT (an actor service in the ref role)"
            )
        if cfg.teacher.given and cfg.rollout.temperature == 0:
            raise ValueError(
                "a teacher grades the sampler's log-probs, which greedy sampling (rollout.temperature=0) has not"
            )
        if cfg.teacher.given and (cfg.rollout.top_p < 1 or cfg.rollout.top_k > 0):
            log.warning(
                "rollout.top_p/top_k truncate the sampler's distribution: its log-probs are of the truncated one, "
                "and the distillation term compares the teacher's full distribution with it"
            )
        if cfg.actor.policy_loss == "gmpo" and (cfg.teacher.given or estimator == "gae"):
            raise ValueError(
                "actor.policy_loss=gmpo takes one advantage per response (the paper's, and verl's): "
                + ("a teacher grades each token" if cfg.teacher.given else "GAE gives one per token")
                + "; use another policy loss"
            )
        roles = (
            {"actor", "rollout", "reward"}
            | ({"ref"} if needs_ref else set())
            | ({"teacher"} if cfg.teacher.given else set())
            | ({"judge"} if cfg.judge.served else set())
            | ({"env"} if cfg.rollout.multi_turn else set())
        )
        if self.distill_only:  # no estimator: the teacher's term is the advantage
            return roles
        if estimator == "gae" and not self.critic:
            raise ValueError("algorithm.adv_estimator=gae needs a critic: run `meshrl ppo`")
        if estimator in GROUP_BASELINES and cfg.rollout.n < 2:
            log.warning(
                "%s advantages with rollout.n=%d: each prompt's group is one sample, so there is no group baseline and "
                "each sample's advantage is its raw score (no variance reduction); set rollout.n >= 2",
                estimator,
                cfg.rollout.n,
            )
        return roles | ({"critic"} if self.critic else set())

    def step(self, mesh: Mesh, rollouts: Rollouts, number: int, data, indices, uids) -> dict[str, float]:
        cfg, t = mesh.cfg, Timer()
        gen, scored = rollouts.sample_and_score(t, number, indices, uids)
        if not self.scores_checked:
            self.scores_checked = True
            warn_if_flat(scored.scores, number)
        metrics: dict[str, float] = {}
        reuse = own_old_logprobs(cfg)
        batch = self.passes(mesh, t, gen, reuse)
        mask = batch.batch["response_mask"]
        rewards = self.rewards(cfg, scored, batch, metrics)
        advantages, returns = self.advantages(mesh, t, gen, batch, rewards, metrics)
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        if self.critic:
            with t("update_critic"):
                metrics.update(mesh.update("critic", number, "value", value_params(cfg), batch))
        with t("update_actor"):
            metrics.update(mesh.update("actor", number, "ppo", ppo_params(cfg, reuse), batch))
        with t("update_weights"):
            rollouts.push_weights(number)
        metrics.update(mesh.last_push)
        metrics.update(rollout_metrics(gen, scored, batch, advantages, response_limit(cfg)))
        metrics["perf/tokens_per_s"] = mask.sum().item() / max(1e-9, sum(t.values()))
        return {**metrics, **t}

    def passes(self, mesh: Mesh, t: Timer, gen: DataProto, reuse: bool) -> DataProto:
        """The step's batch with the log-probs and values the update needs: the actor's old ones unless the
        update finds them itself (reuse), the ref's, the critic's values."""
        cfg = mesh.cfg
        batch = gen.select(POLICY_TENSORS)
        if ROUTED in gen.batch:  # routing replay R3: the experts the rollout chose, for every pass
            batch.batch[ROUTED] = gen.batch[ROUTED]
        if reuse or cfg.algorithm.corrects:  # reuse: the update reports the rollout's distance
            batch.batch["rollout_logprobs"] = gen.batch["rollout_logprobs"]
        if not reuse:
            with t("old_log_prob"):
                batch.batch["actor_logprobs"] = mesh.logprobs("actor", batch)
        if mesh.has("ref"):
            with t("ref"):
                batch.batch["ref_logprobs"] = mesh.logprobs("ref", batch)
        if self.critic:
            with t("values"):
                batch.batch["values"] = mesh.values(batch)
        return batch

    def rewards(self, cfg, scored, batch: DataProto, metrics: dict) -> torch.Tensor:
        """Token-level rewards: the scores, DAPO's overlong penalty, the KL penalty (InstructGPT's)."""
        rewards, mask, al = scored.token_level_scores, batch.batch["response_mask"], cfg.algorithm
        assert rewards is not None  # the Score request carries the response_mask: Scores has token scores
        if al.overlong_buffer:
            penalty = overlong_penalty(mask, cfg.rollout.max_new_tokens, al.overlong_buffer, al.overlong_penalty)
            rewards = rewards + token_level(penalty, mask)  # with the score, on the last response token
            metrics["critic/overlong_penalty/mean"] = penalty.mean().item()
            metrics["critic/overlong_penalty/share"] = (penalty < 0).float().mean().item()
        if al.use_kl_in_reward:
            actor, ref = batch.batch["actor_logprobs"], batch.batch["ref_logprobs"]
            rewards, kl = apply_kl_penalty(rewards, actor, ref, mask, self.kl_ctrl.value, al.kl_penalty)
            metrics.update({"actor/reward_kl_penalty": kl.item(), "actor/reward_kl_penalty_coeff": self.kl_ctrl.value})
            self.kl_ctrl.update(kl.item(), n_steps=len(batch))
        return rewards

    def advantages(self, mesh: Mesh, t: Timer, gen, batch, rewards, metrics: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns): the estimator's, plus a teacher's distillation term."""
        al, mask = mesh.cfg.algorithm, batch.batch["response_mask"]
        with t("adv"):
            if self.distill_only:
                advantages = returns = torch.zeros_like(mask, dtype=torch.float32)
            else:
                uids, values = list(gen.non_tensor_batch["uid"]), batch.batch.get("values")
                inputs = AdvantageInputs(rewards, mask, uids, values, al.gamma, al.lam, al.norm_adv_by_std)
                advantages, returns = ADVANTAGE_ESTIMATORS[al.adv_estimator or self.estimator](inputs)
        if mesh.has("teacher"):
            with t("teacher"):
                teacher = mesh.logprobs("teacher", batch)
            term, distilled = distillation_advantages(teacher, gen.batch["rollout_logprobs"], mask, al.distill_coef)
            metrics.update(distilled)
            advantages = advantages + term
            returns = advantages if self.distill_only else returns
        return advantages, returns

    def state_dict(self) -> dict:
        return {"kl_coef": self.kl_ctrl.value}

    def load_state_dict(self, state: dict) -> None:
        self.kl_ctrl.value = state["kl_coef"]


def ppo() -> PolicyGradient:
    return PolicyGradient("ppo", "gae", critic=True)


def grpo() -> PolicyGradient:
    return PolicyGradient("grpo", "grpo")


def rloo() -> PolicyGradient:
    return PolicyGradient("rloo", "rloo")


def reinforce() -> PolicyGradient:
    return PolicyGradient("reinforce", "reinforce_plus_plus")


def opd() -> PolicyGradient:
    return PolicyGradient("opd", "grpo", distill_only=True)
