"""The actor service's typed settings: how the engine holds the model, and how it optimizes.

EngineSettings and OptimSettings are what a run sets (the run's `actor.*` section is made of them);
EngineConfig and OptimConfig add what the run fills in from elsewhere (trainer.seed, trainer.total_steps)
or leaves at its default (AdamW's betas).
"""

import dataclasses

from meshrl import hosts
from meshrl.config.checked import Checked, FieldError, one_of, require

ROLES = ("actor", "ref", "critic")  # what an actor service serves: a trained policy, a frozen one, values
ENGINE_NAMES = ("fsdp2", "fsdp1", "plain")
ENGINES = ("auto", *ENGINE_NAMES)
LR_SCHEDULES = ("constant", "cosine")
ALL_LINEAR = "all-linear"


def engine_for(engine: str, world: int) -> str:
    """The engine "auto" stands for on `world` ranks: plain for one, fsdp2 for several."""
    return engine if engine != "auto" else "plain" if world == 1 else "fsdp2"


def lora_targets(spec: str) -> list[str]:
    """lora_target_modules as a list: ["all-linear"], or the names it lists; [] if it is malformed."""
    names = [n.strip() for n in spec.split(",")]
    if spec.strip() == ALL_LINEAR:
        return [ALL_LINEAR]
    ok = all(n and n != ALL_LINEAR and all(c.isalnum() or c in "_." for c in n) for n in names)
    return names if ok else []


@dataclasses.dataclass
class EngineSettings(Checked):
    engine: str = "auto"
    """"auto" (plain for one rank, where FSDP's gathers buy nothing; fsdp2 for several), "fsdp2"
    (fully_shard: on several ranks only rank 0 reads the weights, the others build the model on the meta
    device and receive their shards), "fsdp1" (the FullyShardedDataParallel wrapper; every rank reads the
    whole model first) or "plain" (one process, no sharding)."""
    hsdp_replicate: int = 1
    """fsdp2 only: > 1 makes a 2-D mesh (replicate x shard), i.e. HSDP; must divide the world size."""
    sequence_parallel: int = 1
    """> 1: each packed micro-batch's tokens split over this many ranks (Ulysses: an all-to-all turns each
    rank's slice of the tokens into every token of its share of the heads around attention), so a
    sequence longer than one rank's memory trains; groups of consecutive ranks hold the same rows, the
    world's data-parallel width is world_size / sequence_parallel. Must divide the world size and the
    model's attention heads; needs padding_free. Same outputs and gradients as one rank."""
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
    padding_free: bool = True
    """Run each micro-batch's sequences packed into one row, no padding (verl's use_remove_padding, TRL's
    padding_free): positions restart per sequence, attention stays within each (flash-attention's varlen
    kernel on CUDA in half precision); with micro_batch_tokens the budget counts real tokens. Same outputs
    and gradients. With share_prompts, rows that share a prompt run it once in the same packed pass, and
    their responses attend to it. On by default: 0.38-0.93x the padded passes' time on an H200 and
    0.59-0.84x on CPU (bench/RESULTS.md); false runs padded passes."""
    dropout: bool = False
    """Keep the model's dropout in forward passes (off by default: log-probs, values and the PPO
    ratio should not be random)."""
    lora_rank: int = 0
    """> 0: train a LoRA adapter of this rank (peft) instead of every weight; the base weights stay frozen
    and only the adapter's (and a critic's value head) are in the optimizer. ComputeLogProbs with
    without_adapter gives the base model's log-probs (the ref policy without a second model); a push sends
    the adapter alone; a checkpoint holds the adapter and its optimizer state. 0: full fine-tuning. The
    ref role ignores it (the ref is the base model)."""
    lora_alpha: float = 16.0
    """The adapter's update is scaled by lora_alpha / lora_rank. 16 is verl's default (and peft's examples'),
    so a recipe from there carries over; at rank 8 the scale is 2."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input in training passes. Off by default for the reason `dropout` is: the
    PPO ratio of an on-policy pass should be 1, not random."""
    lora_target_modules: str = "all-linear"
    """The layers that get an adapter: "all-linear" (every linear layer of the transformer blocks; not the
    output head, not a value head, not a mixture of experts' one-output gates) or module names,
    comma-separated (e.g. "q_proj,v_proj"), each matching linear layers of the model by the end of their
    name. On a mixture of experts "all-linear" needs lora_experts set, since its experts are not linear
    layers."""
    freeze_vision: bool = True
    """A vision-language model: its vision tower (Qwen2-VL's `visual`, with the merger that feeds the
    language model) is not trained: no gradients for it in full fine-tuning, no adapter on it with LoRA.
    verl's freeze_vision_tower defaults to false; a tower from pretraining seldom gains from RL's few
    signals, and frozen it costs no optimizer state. false: trained as the rest (a tower trained from
    scratch, as the bundled visual task's tiny one, needs it)."""
    lora_experts: bool = False
    """A mixture of experts: the adapter goes on every expert too (peft's target_parameters on the fused
    expert tensors: a rank-r pair per expert and projection, e.g. experts.gate_up_proj and
    experts.down_proj), beside lora_target_modules. Pushes carry the adapter merged
    (rollout.merge_lora=true); lora_dropout must be 0 (peft applies expert adapters to the weights)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "engine", ENGINES)
        require(self.hsdp_replicate >= 1, self, "hsdp_replicate", "must be >= 1")
        require(self.sequence_parallel >= 1, self, "sequence_parallel", "must be >= 1 (1: off)")
        require(
            self.sequence_parallel == 1 or self.padding_free,
            self,
            "sequence_parallel",
            "needs padding_free=true (the split runs in the packed passes' attention)",
        )
        require(self.micro_batch_size >= 1, self, "micro_batch_size", "must be >= 1")
        require(self.micro_batch_tokens >= 0, self, "micro_batch_tokens", "must be >= 0")
        require(self.lora_rank >= 0, self, "lora_rank", "must be >= 0 (0: no adapter)")
        require(self.lora_alpha > 0, self, "lora_alpha", "must be > 0")
        require(0 <= self.lora_dropout < 1, self, "lora_dropout", "must be in [0, 1)")
        require(
            bool(lora_targets(self.lora_target_modules)),
            self,
            "lora_target_modules",
            'must be "all-linear" or module names, comma-separated (e.g. q_proj,v_proj)',
        )
        require(
            not (self.lora_experts and self.lora_dropout),
            self,
            "lora_experts",
            "needs lora_dropout=0: peft adds an expert's adapter to its weights, where no dropout applies",
        )
        if self.hsdp_replicate > 1 and self.engine not in ("fsdp2", "auto"):
            raise FieldError("{hsdp_replicate} > 1 (HSDP) is a configuration of the fsdp2 engine, not " + self.engine)


@dataclasses.dataclass
class EngineConfig(EngineSettings):
    seed: int = 0
    """Seeds what the engine initializes (a critic's value head)."""


@dataclasses.dataclass
class OptimSettings(Checked):
    lr: float = 1e-5
    """AdamW's peak learning rate."""
    weight_decay: float = 0.0
    """AdamW's weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    warmup_steps: int = 0
    """Updates (training steps) of linear warm-up from lr / warmup_steps to lr."""
    lr_schedule: str = "constant"
    """"constant" or "cosine" (decays to min_lr_ratio * lr at the last training step)."""
    min_lr_ratio: float = 0.0
    """The cosine schedule's floor, as a share of lr."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lr > 0, self, "lr", "must be > 0")
        require(self.grad_clip >= 0, self, "grad_clip", "must be >= 0")
        require(self.warmup_steps >= 0, self, "warmup_steps", "must be >= 0")
        one_of(self, "lr_schedule", LR_SCHEDULES)
        require(0 <= self.min_lr_ratio <= 1, self, "min_lr_ratio", "must be in [0, 1]")


@dataclasses.dataclass
class OptimConfig(OptimSettings):
    betas: tuple[float, float] = (0.9, 0.999)
    total_steps: int = 0
    """Updates in the whole run, for the cosine schedule (0 with cosine is an error)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lr_schedule != "cosine" or self.total_steps > 0, self, "total_steps", "must be > 0 with cosine")


@dataclasses.dataclass
class RankSettings(Checked):
    """How many ranks a service on the actor's code runs and how many threads each (a run's `actor.*`,
    `ref.*`, `critic.*` and `teacher.*`, and `meshrl serve actor`'s flags)."""

    world_size: int | str = "auto"  # ranks of the service's process group; auto: one per visible GPU, or
    #   1 on CPU (one rank with every core trains faster there than FSDP over several)
    threads: int = 0  # torch threads per rank; 0: the cores shared out over the ranks on this machine
    #   (never more threads than cores); ref, critic and teacher: 0 takes actor.threads

    def __post_init__(self) -> None:
        try:
            self.world_size = hosts.world_size(self.world_size)
        except ValueError:
            require(False, self, "world_size", f"must be a number of ranks >= 1 or {hosts.AUTO!r}")
        super().__post_init__()
        require(self.threads >= 0, self, "threads", "must be >= 0 (0: the cores shared out over the ranks)")


@dataclasses.dataclass
class ActorServiceConfig(RankSettings):
    """`meshrl serve actor`'s own flags, beside its engine and optimizer settings."""

    role: str = "actor"  # actor (trained), ref (frozen log-probs) or critic (values)
    model: str = ""  # HF folder; given, the service initializes itself; empty: the run sends Init
    checkpoint_root: str = "."  # SaveCheckpoint and LoadCheckpoint paths must lie under this folder
    #   (default: the working directory); relative paths are taken from it
    local_ranks: int = 0  # ranks this process starts here (0: all); fewer: the group spans nodes, the
    #   other ranks are started on theirs (`python -m services.actor.rank ROLE` with node_env), and they
    #   meet in a TCP store on --host at --group-port, each key behind MESHRL_GROUP_SECRET
    group_port: int = 0  # the group's TCP store (with --local-ranks); 0: a free one

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "role", ROLES)
        assert isinstance(self.world_size, int)  # RankSettings made it one
        require(0 <= self.local_ranks <= self.world_size, self, "local_ranks", f"must be in 0..{self.world_size}")
        require(0 <= self.group_port < 65536, self, "group_port", "must be a port number (0: a free one)")
