"""Actor service: trainable (actor, critic) and frozen (ref) models on an FSDP process group.

- config: EngineConfig and OptimConfig.
- engine/: the training engines (fsdp2, fsdp1, plain), chosen by name.
- model: loading, and the per-token outputs a forward pass gives.
- losses: the update losses' typed parameters and which role uses which.
- roles: actor, ref, critic on top of an engine (the RL math is meshrl.algos).
- batches: request checks, sharding over ranks, mini/micro-batches.
- comm, handler, launch, rank: rank 0 drives the group; every rank runs the handler.
- servicer, main: the gRPC service and `meshrl serve actor`.
"""
