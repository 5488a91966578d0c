"""Rollout service: generation on vLLM (HF generate for small models), and weight updates.

- its settings: RolloutConfig in meshrl/config, shared with the run; sampling: the request's sampling
  parameters, checked, and what a backend returns per sample.
- backend_vllm, backend_hf: the engines; vllm_ext runs inside vLLM's workers, and registers vllm_transfer
  there (meshrl's transports as a vLLM weight-transfer engine, its standard update phases); row_sampler gives
  backend_hf's samples a random stream each, so a prompt samples the same whatever else is in its call.
- layout: prompts in, verl's rollout layout out.
- weights: the receiving side of the weight-update protocol (meshrl.weights is the sender's); relay
  passes a stream push's buckets down a chain of replicas; transports: what a bucket may carry on each
  transport (CUDA IPC, shm, bytes) and where its tensors are read from; base: the weights as last received,
  which a delta push's changes are applied to.
- gate: in-flight weight updates (rollout.on_update=keep), generation paused between engine steps while an
  update loads, each token tagged with the weight version that produced it.
- servicer, main: the gRPC service and `meshrl serve rollout`.
"""
