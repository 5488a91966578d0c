"""Rollout service: generation on vLLM (HF generate for small models), weight updates.

Not built yet: the rollout issue builds it on top of meshrl.rpc and the RolloutService proto.
"""
