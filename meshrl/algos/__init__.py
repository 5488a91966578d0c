"""The RL math as pure functions over tensors: masks, KL, advantages, losses, DPO pairs.

Shapes use B for rows (responses) and T for response tokens. Nothing here knows
about services, configs or devices; each function is checked in
tests/unit/test_algos_*.py against values computed by hand.

- masked: masked mean/sum/var, whitening, loss aggregation modes.
- kl: k1/k2/k3 estimators, the KL penalty in the reward, fixed and adaptive controllers.
- advantages: GAE, GRPO (and Dr.GRPO), RLOO, REINFORCE++ (and its baseline variant).
- losses: PPO policy loss (asymmetric and dual clip), clipped value loss, DPO (sigmoid, IPO), SFT, entropy.
- pairs: online-DPO pairs, best vs worst response per prompt.
"""
