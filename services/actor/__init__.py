"""Actor service: trainable (actor, critic) and frozen (ref) models on an FSDP process group.

- its settings (EngineConfig, OptimConfig) and loss parameters live in meshrl/config, shared with the run.
- engine/: the training engines (fsdp2, fsdp1, plain), chosen by name.
- model: loading, and the per-token outputs a forward pass gives.
- losses: which role trains with which loss, and the loss's parameters built from a request.
- roles: actor, ref, critic on top of an engine (the RL math is meshrl.algos).
- batches: request checks, sharding over ranks, mini/micro-batches.
- comm, handler, launch, rank: rank 0 drives the group; every rank runs the handler.
- servicer, main: the gRPC service and `meshrl serve actor`.
"""
