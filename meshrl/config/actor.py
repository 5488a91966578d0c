"""The actor service's typed settings: how the engine holds the model, and how it optimizes."""

import dataclasses

ENGINE_NAMES = ("fsdp2", "fsdp1", "plain")
LR_SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass
class EngineConfig:
    engine: str = "fsdp2"
    """"fsdp2" (fully_shard, the default: on several ranks only rank 0 reads the weights, the others
    build the model on the meta device and receive their shards), "fsdp1" (the FullyShardedDataParallel
    wrapper; every rank reads the whole model first) or "plain" (one process, no sharding: debugging)."""
    hsdp_replicate: int = 1
    """FSDP2 only: > 1 makes a 2-D mesh (replicate x shard), i.e. HSDP; must divide the world size."""
    mixed_precision: bool = False
    """bf16 parameters in forward/backward, fp32 gradient reduction and master weights."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute."""
    micro_batch_size: int = 8
    """Rows per forward/backward pass on each rank (when micro_batch_tokens is 0)."""
    micro_batch_tokens: int = 0
    """> 0: micro-batches by token budget instead (verl's dynamic batch size): rows of similar length
    grouped so that rows x (longest prompt + longest response) stays within it, each pass cut to its own
    longest row. Same loss and gradients; fewer padded tokens."""
    share_prompts: bool = True
    """Causal LMs: rows of a micro-batch with the same prompt (a GRPO group, a DPO pair) run it once, and
    the token budget counts it once. Same outputs and gradients; less compute where prompts repeat."""
    seed: int = 0
    """Seeds what the engine initializes (a critic's value head)."""
    dropout: bool = False
    """Keep the model's dropout in forward passes (off by default: log-probs, values and the PPO
    ratio should not be random)."""

    def __post_init__(self):
        if self.engine not in ENGINE_NAMES:
            raise ValueError(f"engine must be one of {ENGINE_NAMES}, got {self.engine!r}")
        if self.hsdp_replicate < 1 or self.micro_batch_size < 1 or self.micro_batch_tokens < 0:
            raise ValueError("hsdp_replicate and micro_batch_size must be >= 1, micro_batch_tokens >= 0")
        if self.hsdp_replicate > 1 and self.engine != "fsdp2":
            raise ValueError("hsdp_replicate > 1 (HSDP) is a configuration of the fsdp2 engine")


@dataclasses.dataclass
class OptimConfig:
    lr: float = 1e-5
    """AdamW's peak learning rate."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    warmup_steps: int = 0
    """Updates (training steps) of linear warm-up from lr / warmup_steps to lr."""
    total_steps: int = 0
    """Updates in the whole run, for the cosine schedule (0 with cosine is an error)."""
    lr_schedule: str = "constant"
    """"constant" or "cosine" (decays to min_lr_ratio * lr at total_steps)."""
    min_lr_ratio: float = 0.0
    """The cosine schedule's floor, as a share of lr."""

    def __post_init__(self):
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.lr_schedule == "cosine" and self.total_steps <= 0:
            raise ValueError("the cosine schedule needs total_steps > 0")
        if self.lr <= 0 or self.grad_clip < 0 or self.warmup_steps < 0:
            raise ValueError("lr must be > 0; grad_clip and warmup_steps >= 0")
