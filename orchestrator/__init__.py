"""Orchestrator: the stateless algorithm loops (PPO, GRPO, RLOO, REINFORCE++, DPO, SFT).

Not built yet: the orchestrator issue builds it; it talks to services only through
their gRPC clients.
"""
