"""The run's configuration: one YAML file, a typed section per part, dotted overrides on the command line.

    cfg = load_config("configs/grpo.yaml", ["actor.lr=1e-5", "rollout.n=8"])

Unknown sections or keys and wrong types are errors naming the key; the
resolved config is saved with the run (save_config). Each field's comment says
what it does; the sections mirror the services (actor, ref, critic, rollout,
reward), the data, the algorithm and the trainer.
"""

import dataclasses
import pathlib
import re
import typing

import yaml

from meshrl import hosts
from meshrl.config.actor import LR_SCHEDULES
from meshrl.flags import field_docs
from meshrl.typed import build
from orchestrator import verl_keys

LOGGERS = ("console", "tensorboard", "wandb", "mlflow")


class NumbersLoader(yaml.SafeLoader):
    """YAML as users write numbers: PyYAML follows YAML 1.1, where `1e-5` (no dot) is a string; YAML 1.2,
    JSON and Python read it as a float, and so do verl's configs (OmegaConf). Everything else is SafeLoader."""


NumbersLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+][0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def read_yaml(text: str):
    return yaml.load(text, Loader=NumbersLoader)


@dataclasses.dataclass
class DataSection:
    train_files: str = ""  # parquet in verl's schema
    val_files: str = ""  # held-out parquet, same schema; empty: no validation
    prompt_key: str = "prompt"  # the column holding each prompt: chat messages, or a string (one user message)
    max_prompt_length: int = 0  # prompt tokens (chat template applied); longer prompts are dropped and
    #   counted; 0: whatever fits rollout.max_model_len - rollout.max_new_tokens
    train_batch_size: int = 16  # prompts per step (each sampled rollout.n times)
    val_batch_size: int = 64  # held-out prompts per Generate call
    shuffle: bool = True  # a new seeded order every epoch; false: file order


@dataclasses.dataclass
class ActorSection:
    model: str = ""  # HuggingFace folder
    address: str = ""  # a running actor service; empty: start one
    world_size: int | str = "auto"  # ranks of the actor's process group; auto: one per visible GPU, or
    #   1 on CPU (one rank with every core trains faster there than FSDP over several)
    engine: str = "auto"  # fsdp2, fsdp1, plain (one process, no sharding; world_size must be 1), or auto:
    #   plain for one rank (FSDP's gathers buy nothing there), fsdp2 for several
    threads: int = 0  # torch threads per rank; 0: the cores shared out over the ranks (never more
    #   threads than cores)
    lr: float = 1e-5  # AdamW's learning rate
    weight_decay: float = 0.0  # AdamW's weight decay
    warmup_steps: int = 0  # training steps of linear warm-up to lr
    lr_schedule: str = "constant"  # constant, or cosine: decays to min_lr_ratio * lr at trainer.total_steps
    min_lr_ratio: float = 0.0  # the cosine schedule's floor, as a share of lr
    grad_clip: float = 1.0  # max global gradient norm; 0: no clipping
    mixed_precision: bool = False  # bf16 parameters in forward/backward, fp32 gradient reduction and
    #   master weights
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory
    hsdp_replicate: int = 1  # fsdp2: > 1 replicates over this many groups and shards within each (HSDP)
    micro_batch_size: int = 8  # rows per forward/backward pass on each rank
    micro_batch_tokens: int = 0  # > 0: micro-batches by this token budget instead (verl's dynamic batch
    #   size): rows of similar length together, each pass cut to its own longest row; same gradients
    share_prompts: bool = True  # rows with the same prompt (a GRPO group, a DPO pair) run it once in the
    #   actor's passes (same outputs and gradients, less compute); false: every row runs its whole sequence
    dropout: bool = False  # keep the model's dropout in training passes (off: log-probs are not random)
    ppo_epochs: int = 1  # passes over each batch
    reuse_logprobs: bool = True  # an on-policy update (ppo_epochs=1, one mini-batch, no KL in the reward)
    #   takes the PPO ratio against its own detached log-probs instead of a log-prob pass before it (as
    #   TRL and verl do; same gradients); false: always run that pass
    mini_batch_size: int = 0  # rows per optimizer step; 0: the whole batch
    clip_ratio_low: float = 0.2  # PPO clip: ratio >= 1 - clip_ratio_low
    clip_ratio_high: float = 0.2  # PPO clip: ratio <= 1 + clip_ratio_high (DAPO's clip-higher when larger)
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    entropy_coeff: float = 0.0  # entropy bonus in the policy loss
    use_kl_loss: bool = False  # KL(actor || ref) as a loss term (GRPO's), needs the ref service
    kl_loss_coef: float = 0.001  # its weight
    kl_loss_type: str = "k3"  # k1, k2, k3 (low-variance), abs, mse
    loss_agg_mode: str = "token-mean"  # token-mean, seq-mean-token-sum, seq-mean-token-mean

    def __post_init__(self):
        self.world_size = hosts.world_size(self.world_size)
        if self.threads < 0:
            raise ValueError(f"threads={self.threads} must be >= 0 (0: the cores shared out over the ranks)")
        if self.lr_schedule not in LR_SCHEDULES or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(
                f"lr_schedule must be one of {LR_SCHEDULES} (got {self.lr_schedule!r}) and "
                f"min_lr_ratio in [0, 1] (got {self.min_lr_ratio})"
            )


@dataclasses.dataclass
class RefSection:
    address: str = ""  # a running ref service; empty: start one when the algorithm needs it
    world_size: int | str = "auto"  # ranks of the ref's process group (auto: as the actor's)

    def __post_init__(self):
        self.world_size = hosts.world_size(self.world_size)


@dataclasses.dataclass
class CriticSection:
    model: str = ""  # empty: the actor's model with a value head
    address: str = ""  # a running critic service; empty: start one (ppo)
    world_size: int | str = "auto"  # ranks of the critic's process group (auto: as the actor's)
    lr: float = 1e-5  # the critic's learning rate
    clip_range_value: float = 0.5  # value clipping around the old values

    def __post_init__(self):
        self.world_size = hosts.world_size(self.world_size)


@dataclasses.dataclass
class RolloutSection:
    address: str = ""  # a running rollout service; empty: start one
    backend: str = "vllm"  # vllm, or hf (transformers' generate: small models, debugging)
    n: int = 4  # samples per prompt
    temperature: float = 1.0  # sampling temperature (the actor's log-probs use the same)
    top_p: float = 1.0  # nucleus sampling; 1: off
    top_k: int = -1  # -1: off
    max_new_tokens: int = 16  # response tokens at most
    max_model_len: int = 256  # prompt + response tokens the engine holds per sequence
    weight_transport: str = "shm"  # actor -> rollout: shm (same host), stream (any host), cuda_ipc (same GPU)
    weight_bucket_mb: int = 512  # weights are gathered, sent and loaded this many MiB at a time
    dtype: str = "float32"  # the engine's weights and compute: float32, bfloat16, float16
    tensor_parallel_size: int = 1  # vllm: GPUs the engine spreads over
    gpu_memory_utilization: float = 0.3  # vllm: share of GPU memory the engine may take
    kv_cache_gb: float = 1.0  # vllm on CPU: KV cache size
    enforce_eager: bool = True  # vllm: no CUDA graphs (starts sooner; false decodes faster on a GPU)
    max_samples: int = 65536  # the rollout refuses a Generate asking for more samples (prompts x n)
    colocate: bool = False  # one GPU for all: the rollout sleeps while the models train, and the actor,
    #   ref and critic move their weights and optimizer state to host memory while it generates
    on_update: str = "wait"  # a push meeting Generate calls in flight: wait for them, or interrupt them
    #   (they are sent again, on the new weights)
    chunks: int = 1  # a step's prompts go out as this many concurrent Generate calls, each scored as soon
    #   as it returns (vLLM steps them together; the HF backend takes them in turn)
    multi_turn: bool = False  # every sample is an episode in the environment service (env.*): turns of
    #   the policy and observations of the environment, trained on the policy's tokens only
    max_turns: int = 4  # multi-turn: policy turns per episode at most (each up to max_new_tokens)
    max_response_tokens: int = 0  # multi-turn: the whole response (turns and observations); 0: max_turns
    #   x max_new_tokens
    concurrency: int = 256  # multi-turn: episodes played at once


@dataclasses.dataclass
class RewardSection:
    address: str = ""  # any RewardService server; empty: start ours (see docs/wire.md for the contract)
    function: str | None = None  # path/to/file.py:compute_score; None: built-in scorers by data_source
    batched: bool = False  # the function takes lists: compute_score(data_sources=, solution_strs=,
    #   ground_truths=, extra_infos=) -> list, as verl's batched reward manager calls it
    workers: int = 2  # worker processes for the function; 0: in the service process
    timeout: float = 10.0  # seconds per sample before it counts as failed
    on_error: str = "fail"  # a failed sample: fail (stop the step) or score (error_score, counted in
    #   reward/num_failed and warned about)
    error_score: float = 0.0  # the score of a failed sample with on_error=score
    model: str | None = None  # a sequence-classification reward model (HF folder) scores prompt + response
    #   through its own chat template, instead of a function or the built-in scorers
    batch_size: int = 32  # reward model: samples per forward pass
    max_length: int = 1024  # reward model: tokens kept per sample (the start is cut, the response end kept)
    device: str = "auto"  # reward model: cpu, cuda, or auto (cuda when available)


@dataclasses.dataclass
class EnvSection:
    address: str = ""  # any EnvService server (rollout.multi_turn); empty: start ours with `env`
    module: str = "services.env.calculator:Calculator"  # the environment our service hosts:
    #   package.module:Class or path/to/file.py:Class
    step_timeout: float = 30.0  # seconds a tool call may take; a slower one ends its episode
    workers: int = 256  # tool calls our service runs at once (at least rollout.concurrency)
    reward: str = "env"  # a trajectory's score: env (the environment's rewards, summed), service (the
    #   reward service on the whole response text) or sum (both)
    error_score: float = 0.0  # the environment's part of the score of an episode it failed


@dataclasses.dataclass
class AlgorithmSection:
    adv_estimator: str = ""  # empty: the command's own (ppo: gae, grpo, rloo, reinforce: reinforce_plus_plus)
    gamma: float = 1.0  # discount (GAE)
    lam: float = 1.0  # GAE's lambda
    norm_adv_by_std: bool = True  # False: Dr.GRPO
    use_kl_in_reward: bool = False  # reward = score - kl_coef * KL(actor || ref) per token
    kl_penalty: str = "k1"  # the per-token KL estimate in the reward: k1, k2, k3, abs, mse
    kl_ctrl: str = "fixed"  # fixed or adaptive
    kl_coef: float = 0.001  # the penalty's (initial) coefficient
    kl_target: float = 0.1  # adaptive: the KL it steers to
    kl_horizon: int = 10000  # adaptive: samples over which it adjusts
    rollout_is: str = "none"  # correct the loss for the rollout sampling from another policy than the one
    #   trained (its numerics, older weights): token or sequence truncated importance weights
    rollout_is_cap: float = 2.0  # their upper bound
    dpo_beta: float = 0.1  # DPO's inverse temperature
    dpo_loss: str = "sigmoid"  # sigmoid or ipo


@dataclasses.dataclass
class TrainerSection:
    total_steps: int = 50  # training steps (one batch of prompts each)
    save_every: int = 10  # checkpoint every N steps (and at the last); 0: only at the last
    save_final: bool = True  # a checkpoint and the HF folder (run_dir/hf) after the last step; false: only
    #   where save_every falls on it (with save_every=0 the run writes no checkpoint at all)
    val_every: int = 10  # greedy accuracy on data.val_files every N steps (and before the first and
    #   after the last); 0: only before the first and after the last
    samples_per_step: int = 4  # generations logged per step (prompt, response, score, the scorer's
    #   extras) to run_dir/samples.jsonl and TensorBoard; 0: none
    logger: list[str] = dataclasses.field(default_factory=lambda: ["console", "tensorboard"])  # where
    #   metrics go besides metrics.jsonl: console, tensorboard, wandb, mlflow (both offline unless their
    #   own environment variables point at a server)
    val_k: int = 1  # > 1: also sample k answers per held-out prompt (val/acc/mean@k, best@k)
    trace: str = "jsonl"  # OpenTelemetry span exporters for every process: jsonl (run_dir/traces, read by
    #   `meshrl trace RUN_DIR`), console, both ("jsonl,console") or "" (off); OTLP too when
    #   OTEL_EXPORTER_OTLP_ENDPOINT is set
    run_dir: str = "runs/default"
    seed: int = 0  # data order and sampling seeds (step s samples with seed * 1_000_003 + s)
    resume: bool = False  # continue from run_dir/checkpoints/latest
    max_restarts: int = 3  # services this run started that die are started again, this many times in all:
    #   a dead rollout, reward or ref service and the step is retried; a dead actor or critic and the run
    #   goes on from its last checkpoint; 0: a dead service ends the run
    max_staleness: int = 0  # K >= 1: the rollout samples the next K steps while the actor trains this one
    #   (ppo, grpo, rloo, reinforce; orchestrator/pipeline.py); 0: one phase after the other
    given_settings: str = "refuse"  # services given by address that run with other settings than this config
    #   (lr, micro-batching, the rollout's backend and dtype, ...): refuse (stop before the first step, naming
    #   each) or adopt (use theirs; run_dir/config.yaml records them)
    deterministic: bool = True  # K >= 1: step s is sampled from the weights of step max(last checkpoint,
    #   s - 1 - K) in every run and after a resume; false: from the newest the rollout has (within K)

    def __post_init__(self):
        unknown = sorted(set(self.logger) - set(LOGGERS))
        if unknown:
            raise ValueError(f"logger: unknown {unknown}; known: {list(LOGGERS)}")
        if (
            self.total_steps < 1
            or self.save_every < 0
            or self.val_every < 0
            or self.samples_per_step < 0
            or self.max_restarts < 0
            or self.max_staleness < 0
        ):
            raise ValueError(
                "total_steps must be >= 1; save_every, val_every, samples_per_step, max_restarts, max_staleness >= 0"
            )


@dataclasses.dataclass
class RaySection:
    """Only for `meshrl ray ...`: where and how the services are placed."""

    address: str = ""  # "auto" or HOST:PORT of a running cluster; empty: start a local one for the run
    cpus_per_rank: float = 1.0  # each rank's bundle
    gpus_per_rank: float = 0.0
    colocate: list[str] = dataclasses.field(default_factory=list)  # roles sharing the actor's bundles, e.g. [rollout]
    placement_timeout: float = 60.0  # seconds to wait for the cluster to fit a service
    local_cpus: int = 8  # logical CPUs of a local cluster (Ray's count, not cores)
    object_store_bytes: int = 200_000_000  # a local cluster's object store (the services pass no objects)
    tls: bool = True  # mutual TLS between the placed services and this process: certificates made for the run
    #   (run_dir/certs; each service gets only its own, in a private folder on its node); a MESHRL_TLS_DIR
    #   in the environment is used instead


@dataclasses.dataclass
class Config:
    data: DataSection = dataclasses.field(default_factory=DataSection)
    actor: ActorSection = dataclasses.field(default_factory=ActorSection)
    ref: RefSection = dataclasses.field(default_factory=RefSection)
    critic: CriticSection = dataclasses.field(default_factory=CriticSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    reward: RewardSection = dataclasses.field(default_factory=RewardSection)
    env: EnvSection = dataclasses.field(default_factory=EnvSection)
    algorithm: AlgorithmSection = dataclasses.field(default_factory=AlgorithmSection)
    trainer: TrainerSection = dataclasses.field(default_factory=TrainerSection)
    ray: RaySection = dataclasses.field(default_factory=RaySection)


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def from_dict(raw: dict) -> Config:
    if not isinstance(raw, dict):
        raise ValueError(f"a config is a mapping of sections, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ValueError(
            f"unknown config section(s) {unknown}; known: {sorted(SECTIONS)}"
            f"{verl_keys.hints({k: raw[k] for k in unknown if isinstance(raw[k], dict)})}"
        )
    sections = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{name}: a section is a mapping of keys, got {values!r}")
        try:
            sections[name] = build(cls, values, name)
        except ValueError as e:
            raise ValueError(f"{e}{verl_keys.hints({name: values})}") from None
    return Config(**sections)


def apply_override(raw: dict, override: str) -> None:
    """Set `section.key=value` in raw; the value is read as YAML and fitted to the field's type."""
    key, sep, text = override.partition("=")
    parts = key.strip().split(".")
    verl = verl_keys.hint(key.strip())
    if not sep or len(parts) != 2 or not all(parts):
        raise ValueError(f"override {override!r} must look like section.key=value{verl}")
    section, name = parts
    if section not in SECTIONS:
        raise ValueError(f"override {override!r}: unknown section {section!r}; known: {sorted(SECTIONS)}{verl}")
    hints = typing.get_type_hints(SECTIONS[section])
    if name not in hints:
        raise ValueError(f"override {override!r}: unknown key {section}.{name}; known: {sorted(hints)}{verl}")
    value = read_yaml(text) if text.strip() else ""
    if hints[name] is str and not isinstance(value, str) and value is not None:
        value = text.strip()  # model=123 is a path, not a number
    raw.setdefault(section, {})
    if raw[section] is None:
        raw[section] = {}
    raw[section][name] = value


def load_config(path: str | None, overrides: list[str] = ()) -> Config:
    raw = {}
    if path:
        file = pathlib.Path(path)
        if not file.is_file():
            raise ValueError(f"config file {path} not found")
        raw = read_yaml(file.read_text()) or {}
    for o in overrides:
        apply_override(raw, o)
    return from_dict(raw)


def describe_keys(width: int = 100) -> str:
    """Every section.key with its default and what it does, as `meshrl grpo --help` lists them."""
    import textwrap

    out = []
    for name, cls in SECTIONS.items():
        docs = field_docs(cls)
        out.append(
            f"{name}:"
            + (f"  {cls.__doc__.strip()}" if cls.__doc__ and not cls.__doc__.startswith(cls.__name__) else "")
        )
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
            head = f"  {name}.{f.name}={shown}"
            doc = docs.get(f.name, "")
            out.append(textwrap.fill(f"{head}  {doc}" if doc else head, width, subsequent_indent=" " * 6))
    return "\n".join(out)


def save_config(cfg: Config, path: str | pathlib.Path) -> None:
    pathlib.Path(path).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
