"""Rollout service: generation on vLLM (HF generate for small models), and weight updates.

- config, sampling: settings and sampling parameters, checked.
- backend_vllm, backend_hf: the engines; vllm_ext runs inside vLLM's workers.
- layout: prompts in, verl's rollout layout out.
- weights: the receiving side of the weight-update protocol (meshrl.weights is the sender's).
- servicer, main: the gRPC service and `meshrl serve rollout`.
"""
