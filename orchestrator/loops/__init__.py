"""The algorithms: one step each (PPO, GRPO, RLOO, REINFORCE++, online DPO, SFT)."""
