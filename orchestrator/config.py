"""The run's configuration: one YAML file, a typed section per part, dotted overrides on the command line.

    cfg = load_config("configs/grpo.yaml", ["actor.lr=1e-5", "rollout.n=8"])

Unknown sections or keys and wrong types are errors naming the key; the
resolved config is saved with the run (save_config). Each field's comment says
what it does; the sections mirror the services (actor, ref, critic, rollout,
reward), the data, the algorithm and the trainer.
"""

import dataclasses
import pathlib
import typing

import yaml

from meshrl.typed import build


@dataclasses.dataclass
class DataSection:
    train_files: str = ""  # parquet in verl's schema
    val_files: str = ""
    max_prompt_length: int = 64  # longer prompts are dropped and counted
    train_batch_size: int = 16  # prompts per step (each sampled rollout.n times)
    val_batch_size: int = 64
    shuffle: bool = True


@dataclasses.dataclass
class ActorSection:
    model: str = ""  # HuggingFace folder
    address: str = ""  # a running actor service; empty: start one
    world_size: int = 1
    engine: str = "fsdp2"
    lr: float = 1e-5
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch_size: int = 8
    ppo_epochs: int = 1
    mini_batch_size: int = 0  # rows per optimizer step; 0: the whole batch
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "k3"
    loss_agg_mode: str = "token-mean"


@dataclasses.dataclass
class RefSection:
    address: str = ""  # a running ref service; empty: start one when the algorithm needs it
    world_size: int = 1


@dataclasses.dataclass
class CriticSection:
    model: str = ""  # empty: the actor's model with a value head
    address: str = ""
    world_size: int = 1
    lr: float = 1e-5
    clip_range_value: float = 0.5


@dataclasses.dataclass
class RolloutSection:
    address: str = ""
    backend: str = "vllm"
    n: int = 4  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16
    max_model_len: int = 256
    weight_transport: str = "shm"  # shm, stream or cuda_ipc


@dataclasses.dataclass
class RewardSection:
    address: str = ""  # any RewardService server; empty: start ours
    function: str | None = None  # path/to/file.py:compute_score; None: built-in scorers by data_source
    workers: int = 2
    timeout: float = 10.0
    on_error: str = "fail"


@dataclasses.dataclass
class AlgorithmSection:
    adv_estimator: str = ""  # empty: the command's own (ppo: gae, grpo, rloo, reinforce: reinforce_plus_plus)
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std: bool = True  # False: Dr.GRPO
    use_kl_in_reward: bool = False  # reward = score - kl_coef * KL(actor || ref) per token
    kl_penalty: str = "k1"
    kl_ctrl: str = "fixed"  # fixed or adaptive
    kl_coef: float = 0.001
    kl_target: float = 0.1
    kl_horizon: int = 10000
    dpo_beta: float = 0.1
    dpo_loss: str = "sigmoid"  # sigmoid or ipo


@dataclasses.dataclass
class TrainerSection:
    total_steps: int = 50
    save_every: int = 10
    val_every: int = 10  # greedy accuracy on data.val_files every N steps (and before the first)
    val_k: int = 1  # > 1: also sample k answers per held-out prompt (val/acc/mean@k, best@k)
    tensorboard: bool = True  # events in run_dir/tensorboard next to metrics.jsonl
    trace: str = "jsonl"  # OpenTelemetry span exporters for every process: jsonl (run_dir/traces, read by
    #   `meshrl trace RUN_DIR`), console, both ("jsonl,console") or "" (off); OTLP too when
    #   OTEL_EXPORTER_OTLP_ENDPOINT is set
    run_dir: str = "runs/default"
    seed: int = 0  # data order and sampling seeds (step s samples with seed * 1_000_003 + s)
    resume: bool = False  # continue from run_dir/checkpoints/latest


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


@dataclasses.dataclass
class Config:
    data: DataSection = dataclasses.field(default_factory=DataSection)
    actor: ActorSection = dataclasses.field(default_factory=ActorSection)
    ref: RefSection = dataclasses.field(default_factory=RefSection)
    critic: CriticSection = dataclasses.field(default_factory=CriticSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    reward: RewardSection = dataclasses.field(default_factory=RewardSection)
    algorithm: AlgorithmSection = dataclasses.field(default_factory=AlgorithmSection)
    trainer: TrainerSection = dataclasses.field(default_factory=TrainerSection)
    ray: RaySection = dataclasses.field(default_factory=RaySection)


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def from_dict(raw: dict) -> Config:
    if not isinstance(raw, dict):
        raise ValueError(f"a config is a mapping of sections, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown config section(s) {unknown}; known: {sorted(SECTIONS)}")
    sections = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{name}: a section is a mapping of keys, got {values!r}")
        sections[name] = build(cls, values, name)
    return Config(**sections)


def apply_override(raw: dict, override: str) -> None:
    """Set `section.key=value` in raw; the value is read as YAML and fitted to the field's type."""
    key, sep, text = override.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ValueError(f"override {override!r} must look like section.key=value")
    section, name = parts
    if section not in SECTIONS:
        raise ValueError(f"override {override!r}: unknown section {section!r}; known: {sorted(SECTIONS)}")
    hints = typing.get_type_hints(SECTIONS[section])
    if name not in hints:
        raise ValueError(f"override {override!r}: unknown key {section}.{name}; known: {sorted(hints)}")
    value = yaml.safe_load(text) if text.strip() else ""
    if hints[name] is float and isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads "1e-5" as a string
        except ValueError:
            pass
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
        raw = yaml.safe_load(file.read_text()) or {}
    for o in overrides:
        apply_override(raw, o)
    return from_dict(raw)


def save_config(cfg: Config, path: str | pathlib.Path) -> None:
    pathlib.Path(path).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
