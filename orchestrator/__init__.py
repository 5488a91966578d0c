"""Orchestrator: the stateless algorithm loops (PPO, GRPO, RLOO, REINFORCE++, DPO, SFT).

- config: the run's typed YAML config with dotted overrides.
- data: verl parquet to prompt batches; a seeded, resumable sampler.
- services: start the services a run needs (or use running ones), check their health.
- grpo: the GRPO loop (first of the loops; the others come with the orchestrator issue).

The orchestrator talks to services only through gRPC clients (meshrl.clients, meshrl.rpc).
"""
