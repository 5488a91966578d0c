"""Actor service: trainable (actor, critic) and frozen (ref) models on an FSDP process group.

- its settings (EngineConfig, OptimConfig) and loss parameters live in meshrl/config, shared with the run.
- engine/: the training engines (fsdp2, fsdp1, plain), chosen by name.
- model: loading, and the per-token outputs a forward pass gives.
- head: the response tokens' log-probs and entropy without the full-vocabulary logits of a micro-batch.
- packing: padding-free passes (actor.padding_free), a micro-batch's sequences packed end to end in one row.
- attention_extras: what a model's attention adds to causal attention (sinks, soft-cap, sliding window), for
  the packed passes.
- sequence: sequence parallelism (actor.sequence_parallel), DeepSpeed-Ulysses style, in the packed passes.
- lora: LoRA adapters (peft) on an engine's model, and the names their weights travel under.
- losses: which role trains with which loss, and the loss's parameters built from a request.
- roles: actor, ref, critic on top of an engine (the RL math is meshrl.algos).
- batches: request checks, sharding over ranks, mini/micro-batches.
- integrity: checkpoints signed when saved and loaded only when they verify.
- export: `meshrl export`, a saved checkpoint as a HuggingFace folder (and a peft adapter folder), offline.
- comm, handler, launch, rank: rank 0 drives the group; every rank runs the handler.
- servicer, main: the gRPC service and `meshrl serve actor`.
"""
