"""Orchestrator: the stateless algorithm loops (PPO, GRPO, RLOO, REINFORCE++, DPO, SFT).

Built so far: config (typed YAML sections, dotted overrides) and data (verl parquet to
batches; a seeded, resumable sampler). The
loops, config and CLI come with the orchestrator issue; they talk to services
only through their gRPC clients (meshrl.clients, meshrl.rpc).
"""
