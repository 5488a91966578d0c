"""The RL math as pure functions over tensors: masks, KL, advantages, losses, DPO pairs.

Shapes use B for rows (responses) and T for response tokens. Nothing here knows
about services, configs or devices; each function is checked in
tests/unit/test_algos_*.py against values computed by hand.

- masked: masked mean/sum/var, whitening, loss aggregation modes.
- kl: k1/k2/k3 estimators, the KL penalty in the reward, fixed and adaptive controllers.
- advantages: GAE, GRPO (and Dr.GRPO), RLOO, REINFORCE++ (and its baseline variant).
- losses: PPO policy loss (asymmetric and dual clip), clipped value loss, DPO (sigmoid, IPO), SFT, entropy.
- pairs: online-DPO pairs, best vs worst response per prompt.
- policy_losses: the policy-gradient losses, one function each, and POLICY_LOSS_FNS (name -> function).
- rollout_correction: importance weights and rejection for a rollout that sampled with other numerics or weights.
- shaping: reward shaping before advantages, DAPO's soft overlong penalty.
- filtering: DAPO's dynamic sampling, the groups whose scores vary.
- distill: on-policy distillation's per-token advantage, teacher minus student log-probs.
- moe: a mixture of experts' router terms: load-balancing loss, router z-loss, expert load.
- router_replay: routing replay (R2, R3), a forward pass with given experts instead of routing afresh.
"""
