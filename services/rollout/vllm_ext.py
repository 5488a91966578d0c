"""Runs inside vLLM's worker processes (LLM(worker_extension_cls=...)): load weights from shared memory
or from a CUDA IPC handle.

The rollout service stages a full set of HF-named parameters in a /dev/shm
segment and calls meshrl_load_weights through llm.collective_rpc with plain
arguments (no pickled callables); each worker maps the segment and reloads its
model in place through vLLM's own loading path.
"""

import torch

from meshrl import cuda_ipc
from meshrl.shm import attach


class WeightLoader:
    def meshrl_load_weights(self, segment: str, refs: list[list]) -> int:
        """refs: [name, dtype name, shape, byte offset] per parameter. Returns how many were loaded."""
        seg = attach(segment)
        weights = [(name, seg.tensor(getattr(torch, dtype), shape, offset)) for name, dtype, shape, offset in refs]
        self.model_runner.reload_weights(weights_iterator=iter(weights))
        return len(refs)

    def meshrl_load_weights_cuda_ipc(self, handle: list, refs: list[list]) -> int:
        """The same, from the sender's CUDA bucket shared by IPC handle (same GPU)."""
        weights = cuda_ipc.views(cuda_ipc.open_handle(handle), refs)
        self.model_runner.reload_weights(weights_iterator=iter(weights))
        return len(refs)
