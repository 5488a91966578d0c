"""Online DPO (Guo et al. 2024, arXiv:2402.04792; verl's DPO extension guide): per prompt, sample n
responses, score them, pair the best against the worst (ties skipped), and take a DPO step
(Rafailov et al. 2023) against the frozen reference policy.

    generate n per prompt -> score -> best/worst pairs -> ref log-probs -> DPO update -> push weights
"""

import dataclasses

import torch

from meshrl.algos.pairs import best_worst_pairs
from orchestrator.config import Config
from orchestrator.lifecycle.mesh import POLICY_TENSORS, Mesh
from orchestrator.loops.params import dpo_params
from orchestrator.output.readings import score_metrics
from orchestrator.sampling import combinations
from orchestrator.sampling.rollouts import Rollouts
from orchestrator.timer import Timer


@dataclasses.dataclass
class OnlineDPO:
    name: str = "dpo"
    trained: tuple[str, ...] = ("actor",)

    def setup(self, cfg: Config) -> set[str]:
        combinations.check(cfg, self.name)  # its pairs are single-turn answers of this step
        if cfg.rollout.n < 2:
            raise ValueError(
                f"online DPO pairs responses to the same prompt: rollout.n must be >= 2, got {cfg.rollout.n}"
            )
        return {"actor", "ref", "rollout", "reward"}

    def step(self, mesh: Mesh, rollouts: Rollouts, number: int, data, indices, uids) -> dict[str, float]:
        cfg, t = mesh.cfg, Timer()
        gen, scored = rollouts.sample_and_score(t, number, indices, uids)
        chosen, rejected = best_worst_pairs(scored.scores, list(gen.non_tensor_batch["uid"]))
        lengths = gen.batch["response_mask"].sum(-1).float()
        metrics = {
            **score_metrics(scored),
            "response_length/mean": lengths.mean().item(),
            "actor/num_pairs": float(len(chosen)),
        }
        if not chosen:  # every prompt's responses scored alike: nothing to prefer
            return {**metrics, **t}
        order = [row for pair in zip(chosen, rejected) for row in pair]  # chosen, rejected, chosen, ...
        pairs = gen.select(POLICY_TENSORS).select_idxs(torch.tensor(order))
        metrics["actor/score_margin"] = (scored.scores[chosen] - scored.scores[rejected]).mean().item()
        with t("ref"):
            pairs.batch["ref_logprobs"] = mesh.logprobs("ref", pairs)
        with t("update_actor"):
            metrics.update(mesh.update("actor", number, "dpo", dpo_params(cfg), pairs))
        with t("update_weights"):
            rollouts.push_weights(number)
        return {**metrics, **mesh.last_push, **t}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
