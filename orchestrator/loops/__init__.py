"""The algorithms: one step each (PPO, GRPO, RLOO, REINFORCE++, online DPO, SFT).

- algorithm: the step contract, what an algorithm is to the run loop (orchestrator.run.trainer).
- policy_gradient: PPO, GRPO, RLOO and REINFORCE++, differing in the advantage estimator and the critic.
- dpo: online DPO, best against worst response per prompt, against the frozen reference.
- sft: SFT through the actor service, on answers or on a conversation's assistant turns.
- params: the loss parameters an update sends the actor or critic, taken from the run config.
"""
