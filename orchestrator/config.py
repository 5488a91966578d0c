"""The run's configuration: one YAML file, a typed section per part, dotted overrides on the command line.

    cfg = load_config("configs/grpo.yaml", ["actor.lr=1e-5", "rollout.n=8"])

Unknown sections or keys and wrong types are errors naming the key (and the
known key closest to a typo); the resolved config is saved with the run
(save_config). The sections mirror the
services (actor, ref, critic, rollout, reward, env), the data, the algorithm
and the trainer. A service's settings are not declared here: its section is
made of the service's own settings classes (meshrl/config), with their
defaults, documentation and checks, plus the keys only a run has (an
address, sampling, ...), each documented by its comment. `meshrl grpo --help`
and docs/configuration.md list them all (describe_keys).
"""

import dataclasses
import difflib
import pathlib
import re
import typing
from collections.abc import Sequence

import yaml

from meshrl import hosts
from meshrl.config.actor import EngineSettings, OptimSettings, RankSettings
from meshrl.config.checked import Checked, FieldError, one_of, require
from meshrl.config.env import EnvSettings
from meshrl.config.losses import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    DPOSettings,
    EpochSettings,
    PolicyLossSettings,
    RolloutISSettings,
    ValueLossSettings,
)
from meshrl.config.reward import RewardConfig
from meshrl.config.rollout import DEFAULT_BUCKET_BYTES, MAX_CALLS, PUSHES, TRANSPORTS, RolloutSettings
from meshrl.flags import field_docs
from meshrl.typed import build
from orchestrator import verl_keys
from orchestrator.judge.settings import JudgeSection

LOGGERS = ("console", "tensorboard", "wandb", "mlflow")
ENV_REWARDS = ("env", "service", "sum")
MAX_CHUNKS = MAX_CALLS  # the rollout serves this many calls at once


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
class DataSection(Checked):
    train_files: str = ""  # rows in verl's schema: parquet, JSON lines, or a `datasets` folder (save_to_disk)
    val_files: str = ""  # held-out rows, same schema and kinds; empty: no validation
    prompt_key: str = "prompt"  # the column holding each prompt: chat messages, or a string (one user message)
    answer_key: str = ""  # the column holding each row's answer, dotted into a struct (`solution`, `label`,
    #   `extra_info.answer`): the reward's ground truth and SFT's target; empty: where verl keeps them
    #   (reward_model.ground_truth, extra_info.answer)
    system_prompt: str = ""  # a system message put before every prompt that has none of its own
    image_key: str = "images"  # the column holding each row's pictures (verl's data.image_key)
    min_pixels: int = 0  # pictures (an `images` column, image parts) smaller are scaled up to this many
    #   pixels, in steps of 28 (Qwen2-VL's); 0: the model's image processor's own floor
    max_pixels: int = 0  # larger pictures are scaled down to this many pixels, fewer image tokens; 0: the
    #   model's image processor's own ceiling
    max_prompt_length: int = 0  # prompt tokens (chat template applied); longer prompts are dropped and
    #   counted; 0: whatever fits rollout.max_model_len - rollout.max_new_tokens
    train_batch_size: int = 16  # prompts per step (each sampled rollout.n times)
    val_batch_size: int = 64  # held-out prompts per Generate call
    shuffle: bool = True  # a new seeded order every epoch; false: file order


@dataclasses.dataclass
class ActorSection(PolicyLossSettings, EpochSettings, OptimSettings, EngineSettings, RankSettings):
    """The policy. Its ranks, engine, optimizer, epochs and policy-loss keys are the actor service's own
    settings (meshrl/config), sent to it as they are."""

    model: str = ""  # HuggingFace folder
    address: str = ""  # a running actor service; empty: start one
    reuse_logprobs: bool = True  # the update finds its own old log-probs instead of a log-prob call
    #   before it: the first mini-batch's from its own pass (the weights are still the old ones; TRL and
    #   verl do so with one mini-batch), the other rows' from a pass inside the update before its first
    #   optimizer step; same gradients, 1/mini-batches of that pass saved. Not with a KL penalty in the
    #   reward (it needs them first). false: always the separate call


@dataclasses.dataclass
class RefSection(RankSettings):
    """The frozen reference policy: the actor's model and engine settings."""

    address: str = ""  # a running ref service; empty: start one when the algorithm needs it


@dataclasses.dataclass
class TeacherSection(RankSettings):
    """On-policy distillation's teacher (docs/training.md "On-policy distillation"): a frozen model with the
    student's tokenizer, served as the ref is (the actor's engine settings), that gives each sampled token
    its log-prob. Naming one (model or address) turns distillation on in the policy-gradient loops."""

    model: str = ""  # the teacher's HF model folder; empty with an empty address: no teacher
    address: str = ""  # a running teacher (an actor service in the ref role); empty: start one from model

    @property
    def given(self) -> bool:
        return bool(self.model or self.address)


@dataclasses.dataclass
class CriticSection(ValueLossSettings, RankSettings):
    """PPO's value model: the actor's engine and optimizer settings, with its own model and learning rate."""

    model: str = ""  # empty: the actor's model with a value head
    address: str = ""  # a running critic service; empty: start one (ppo)
    lr: float = 1e-5  # the critic's learning rate
    lora_rank: int = 0  # > 0: the critic trains a LoRA adapter of this rank (actor.lora_alpha, lora_dropout and
    #   lora_target_modules) and its value head in full; 0: the whole critic trains

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lr > 0, self, "lr", "must be > 0")
        require(self.lora_rank >= 0, self, "lora_rank", "must be >= 0 (0: no adapter)")


@dataclasses.dataclass
class RolloutSection(RolloutSettings):
    """Generation. Its engine keys are the rollout service's own settings (meshrl/config); the sampling and
    weight-sync keys are the run's."""

    address: str = ""  # a running rollout service, or several separated by commas (a fleet); empty: start them
    replicas: int = 1  # rollout services the run starts, each its own engine: each step's prompts are shared
    #   out over them by load, a multi-turn episode stays on one, one weight push reaches all, and a lost one
    #   costs only its share of a step (docs/training.md, "A rollout fleet")
    n: int = 4  # samples per prompt
    temperature: float = 1.0  # sampling temperature (the actor's log-probs use the same)
    top_p: float = 1.0  # nucleus sampling; 1: off
    top_k: int = -1  # -1: off
    max_new_tokens: int = 16  # response tokens at most
    weight_transport: str = "shm"  # actor -> rollout: shm (same host), stream (any host), cuda_ipc (same GPU)
    weight_bucket_mb: int = DEFAULT_BUCKET_BYTES >> 20  # weights are gathered, sent and loaded this many MiB
    #   at a time
    push: str = "auto"  # what a weight push sends: "full" every tensor whole; "delta" only the elements that
    #   changed since the last push (both sides keep a copy of the weights in the rollout's dtype; shm and
    #   stream; docs/training.md, "Delta pushes"); "auto": delta over stream with a bf16 or fp16 rollout,
    #   else full (bench/RESULTS.md, delta pushes)
    weight_relay: bool = True  # stream to a fleet: the actor sends each bucket to the first replica, which
    #   passes it on to the next while it loads it, and so on (one send per bucket, not one per replica);
    #   false: the actor sends it to each replica itself
    chunks: int = 1  # a step's prompts go out as this many concurrent Generate calls, each scored as soon
    #   as it returns (vLLM steps them together; the HF backend takes them in turn)
    partial: bool = False  # partial rollouts: a step trains on the groups that finished and carries the
    #   unfinished samples into the next, where they go on from their tokens on the newer weights (groups
    #   whole; trainer.max_staleness bounds a sample's oldest token; orchestrator/sampling/partial.py)
    partial_tokens: int = 0  # partial: tokens an unfinished sample generates per round; 0: max_new_tokens // 4
    multi_turn: bool = False  # every sample is an episode in the environment service (env.*): turns of
    #   the policy and observations of the environment, trained on the policy's tokens only
    max_turns: int = 4  # multi-turn: policy turns per episode at most (each up to max_new_tokens)
    max_response_tokens: int = 0  # multi-turn: the whole response (turns and observations); 0: max_turns
    #   x max_new_tokens
    concurrency: int = 256  # multi-turn and agent episodes played at once
    tool_parser: str = ""  # multi-turn: "" the text protocol (turns end at the environment's stop strings,
    #   observations appended as text); "hermes": the model's own format (the chat template lists the
    #   environment's tools, turns end at the end token, <tool_call> JSON is parsed, results come back
    #   through the template's tool role); any parser of vLLM's reads its family's format the same way
    #   (llama3_json, mistral, qwen3_coder, deepseek_v3, glm45, pythonic, ...); with an agent, how its
    #   replies' tool calls are read
    agent: str = ""  # every sample is an episode of this agent, "path/file.py:function" or "module:function",
    #   called as function(task, base_url, api_key) -> reward or {"reward": ..., ...} in worker processes; it
    #   talks to the policy through the run's OpenAI-compatible endpoint (docs/agents.md)
    agent_command: str = ""  # or an agent in any language: `sh -c` this per episode, with OPENAI_BASE_URL,
    #   OPENAI_API_KEY and the task as JSON on stdin; it prints its result as JSON on its last line
    agent_workers: int = 2  # rollout.agent: worker processes, each playing its share of rollout.concurrency
    #   episodes at once on threads (agent_command: rollout.concurrency commands at once)
    agent_timeout: float = 300.0  # seconds an agent episode may take; past it, it is killed and lost
    agent_python: str = ""  # rollout.agent: the Python (>= 3.9) its workers run in, e.g. a venv's bin/python
    #   with the agent's framework (meshrl need not be installed there); empty: meshrl's own
    agent_sandbox: str = ""  # rollout.agent / agent_command: where an episode's agent runs programs with POST
    #   {base_url}/sandbox/run, in a sandbox session that lives as long as its episode (docs/agents.md): "auto"
    #   a sandbox service the run starts (bubblewrap), HOST:PORT one already running; "": none (a 404)
    merge_lora: bool = False  # an actor training a LoRA adapter (actor.lora_rank) pushes the base weights with
    #   the adapter merged in, for a rollout without LoRA support; false: the adapter alone (megabytes), which
    #   a rollout the run starts takes (its max_lora_rank is raised to actor.lora_rank)

    @property
    def episodes(self) -> bool:
        """Every sample is an episode of turns: the environment service's, or an agent's."""
        return self.multi_turn or bool(self.agent or self.agent_command)

    @property
    def response_budget(self) -> int:
        """Response tokens a sample may hold: an episode's turns and what came between them, or one turn."""
        return (
            (self.max_response_tokens or self.max_turns * self.max_new_tokens) if self.episodes else self.max_new_tokens
        )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.n >= 1, self, "n", "must be >= 1")
        require(self.replicas >= 1, self, "replicas", "must be >= 1")
        given = hosts.address_list(self.address)
        if len(given) > 1 and self.replicas not in (1, len(given)):
            raise FieldError(
                f"{{address}} lists {len(given)} replicas and {{replicas}}={self.replicas}: the list is the fleet "
                "(leave replicas at 1 or make it the list's length)"
            )
        require(self.max_new_tokens >= 1, self, "max_new_tokens", "must be >= 1")
        if self.max_new_tokens >= self.max_model_len:
            raise FieldError(
                f"{{max_new_tokens}}={self.max_new_tokens} leaves no room for a prompt in "
                f"{{max_model_len}}={self.max_model_len}"
            )
        require(self.temperature >= 0, self, "temperature", "must be >= 0 (0: greedy)")
        require(0 < self.top_p <= 1, self, "top_p", "must be in (0, 1]")
        require(self.top_k == -1 or self.top_k >= 1, self, "top_k", "must be -1 (off) or >= 1")
        one_of(self, "weight_transport", TRANSPORTS)
        one_of(self, "push", PUSHES)
        require(
            not (self.push == "delta" and self.weight_transport == "cuda_ipc"),
            self,
            "push",
            "delta is for weight_transport shm or stream: over {weight_transport}=cuda_ipc nothing crosses a link",
        )
        # any of vLLM's parsers too: its name is checked with the model's tokenizer in preflight (tool_template)
        require(self.tool_parser == self.tool_parser.strip(), self, "tool_parser", "must be a parser's name")
        require(
            not self.tool_parser or self.episodes,
            self,
            "tool_parser",
            "parses multi-turn episodes' tool calls: set rollout.multi_turn=true (or rollout.agent)",
        )
        if self.agent or self.agent_command:
            require(not (self.agent and self.agent_command), self, "agent", "or {agent_command}, not both")
            require(not self.multi_turn, self, "agent", "plays its own episodes: leave {multi_turn} false")
            require(self.agent_workers >= 1, self, "agent_workers", "must be >= 1")
            require(self.agent_timeout > 0, self, "agent_timeout", "must be > 0 seconds")
        require(not self.agent_python or bool(self.agent), self, "agent_python", "is read with {agent}")
        require(not self.agent_sandbox or self.episodes and not self.multi_turn, self, "agent_sandbox", "is for agents")
        require(self.weight_bucket_mb >= 1, self, "weight_bucket_mb", "must be >= 1")
        require(self.partial_tokens >= 0, self, "partial_tokens", "must be >= 0 (0: max_new_tokens // 4)")
        require(self.partial or not self.partial_tokens, self, "partial_tokens", "is read with {partial}=true")
        require(
            1 <= self.chunks <= MAX_CHUNKS,
            self,
            "chunks",
            f"must be in 1..{MAX_CHUNKS} (concurrent Generate calls a step)",
        )


@dataclasses.dataclass
class RewardSection(RewardConfig):
    """Scoring: the reward service's own settings (meshrl/config), or any RewardService server."""

    address: str = ""  # any RewardService server; empty: start ours (see docs/wire.md for the contract)


@dataclasses.dataclass
class EnvSection(EnvSettings):
    """Multi-turn episodes (rollout.multi_turn): the environment service's own settings (meshrl/config) and
    how the run scores a trajectory."""

    address: str = ""  # any EnvService server (rollout.multi_turn); empty: start ours with `module`
    reward: str = "env"  # a trajectory's score: env (the environment's rewards, summed), service (the
    #   reward service on the whole response text) or sum (both)
    error_score: float = 0.0  # the environment's part of the score of an episode it failed

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "reward", ENV_REWARDS)


@dataclasses.dataclass
class AlgorithmSection(RolloutISSettings, DPOSettings):
    adv_estimator: str = ""  # empty: the command's own (ppo: gae, grpo, rloo, reinforce: reinforce_plus_plus)
    gamma: float = 1.0  # discount (GAE)
    lam: float = 1.0  # GAE's lambda
    norm_adv_by_std: bool = True  # False: Dr.GRPO
    use_kl_in_reward: bool = False  # reward = score - kl_coef * KL(actor || ref) per token
    kl_penalty: str = "k1"  # the per-token KL estimate in the reward: k1, k2, k3 or abs
    kl_ctrl: str = "fixed"  # fixed or adaptive
    kl_coef: float = 0.001  # the penalty's (initial) coefficient
    kl_target: float = 0.1  # adaptive: the KL it steers to
    kl_horizon: int = 10000  # adaptive: samples over which it adjusts
    distill_coef: float = 1.0  # with a teacher: x (teacher's - sampler's log-prob) per token, in the advantages
    overlong_buffer: int = 0  # DAPO's overlong reward shaping: a response's last this many tokens before
    #   rollout.max_new_tokens cost a penalty growing linearly to overlong_penalty at the limit; 0: off
    overlong_penalty: float = 1.0  # the penalty at the limit (DAPO's penalty factor)
    dynamic_sampling: bool = False  # DAPO's dynamic sampling: groups whose samples all have the same
    #   dynamic_sampling_metric are dropped and more rounds of prompts sampled until data.train_batch_size
    #   groups are kept (docs/training.md)
    dynamic_sampling_metric: str = "acc"  # acc (the scorer's per-sample acc) or score
    max_sample_rounds: int = 8  # dynamic sampling: rounds a step samples at most (a step that keeps fewer
    #   groups trains on those)

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "kl_penalty", KL_ESTIMATORS)
        one_of(self, "kl_ctrl", KL_CONTROLLERS)
        require(self.overlong_buffer >= 0, self, "overlong_buffer", "must be >= 0 (0: off)")
        require(self.overlong_penalty >= 0, self, "overlong_penalty", "must be >= 0 (a penalty's size)")
        one_of(self, "dynamic_sampling_metric", ("acc", "score"))
        require(self.max_sample_rounds >= 1, self, "max_sample_rounds", "must be >= 1")
        require(self.distill_coef > 0, self, "distill_coef", "must be > 0 (no teacher: leave teacher.* empty)")


@dataclasses.dataclass
class TrainerSection(Checked):
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
    seed: int = 0  # data order and sampling seeds (step s samples with seed * 1_000_003 + s: meshrl/seeds.py)
    resume: bool = False  # continue from run_dir/checkpoints/latest; false: run_dir must hold no run that
    #   trained (checkpoints, or steps in its metrics.jsonl), which a fresh run would overwrite
    max_restarts: int = 3  # services this run started that die are started again, this many times in all:
    #   a dead rollout, reward or ref service and the step is retried; a dead actor or critic and the run
    #   goes on from its last checkpoint; 0: a dead service ends the run
    fork_server: bool = True  # the services this run starts on its host (and starts again) are forked from
    #   one process that imported torch, transformers and the services' code once (cli/forkserver.py),
    #   rather than each importing them; false (or MESHRL_FORK_SERVER=0): each its own fresh interpreter
    max_staleness: int = 0  # K >= 1: the rollout samples the next K steps while the actor trains this one
    #   (ppo, grpo, rloo, reinforce; orchestrator/sampling/pipeline.py); 0: one phase after the other
    given_settings: str = "refuse"  # services given by address that run with other settings than this config
    #   (lr, micro-batching, the rollout's backend and dtype, ...): refuse (stop before the first step, naming
    #   each) or adopt (use theirs; run_dir/config.yaml records them)
    deterministic: bool = True  # K >= 1: step s is sampled from the weights of step max(last checkpoint,
    #   s - 1 - K) in every run and after a resume; false: from the newest the rollout has (within K)
    parity_bound: float | None = None  # rollout/kl_to_actor (mean |rollout - actor| log-prob) a compared
    #   step may reach: past it the rollout computes the model otherwise than the actor, and the run stops
    #   (orchestrator/run/parity.py); null: by dtype, 1e-5 in float32, 2e-2 with bfloat16 or float16 on
    #   either side (rollout.dtype, actor.mixed_precision), none where the two differ by design (vLLM's
    #   log-probs with top_k/top_p, of the truncated distribution; actor.dropout); a number: that bound;
    #   0 or less: a warning past the dtype's bound, no stop. A jump after a weight push stops the run
    #   whatever this says

    def __post_init__(self) -> None:
        super().__post_init__()
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


RANK_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")  # Ray's placement strategies


@dataclasses.dataclass
class RaySection(Checked):
    """Only for `meshrl ray ...`: where and how the services are placed."""

    address: str = ""  # "auto" or HOST:PORT of a running cluster; empty: start a local one for the run
    cpus_per_rank: float = 1.0  # each rank's bundle
    gpus_per_rank: float = 0.0
    colocate: list[str] = dataclasses.field(default_factory=list)  # roles sharing the actor's bundles, e.g. [rollout]
    rank_strategy: str = "STRICT_PACK"  # a trained service's ranks (actor, ref, critic): STRICT_PACK on one
    #   node, children of rank 0; PACK, SPREAD or STRICT_SPREAD may (must) put them on other nodes, which join
    #   rank 0's process group over the network (a TCP store behind the run's secret)
    placement_timeout: float = 60.0  # seconds to wait for the cluster to fit a service
    local_cpus: int = 8  # logical CPUs of a local cluster (Ray's count, not cores)
    object_store_bytes: int = 200_000_000  # a local cluster's object store (the services pass no objects)
    tls: bool = True  # mutual TLS between the placed services and this process: certificates made for the run
    #   (run_dir/certs; each service gets only its own, in a private folder on its node); a MESHRL_TLS_DIR
    #   in the environment is used instead

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "rank_strategy", RANK_STRATEGIES)


@dataclasses.dataclass
class Config:
    data: DataSection = dataclasses.field(default_factory=DataSection)
    actor: ActorSection = dataclasses.field(default_factory=ActorSection)
    ref: RefSection = dataclasses.field(default_factory=RefSection)
    teacher: TeacherSection = dataclasses.field(default_factory=TeacherSection)
    critic: CriticSection = dataclasses.field(default_factory=CriticSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    reward: RewardSection = dataclasses.field(default_factory=RewardSection)
    env: EnvSection = dataclasses.field(default_factory=EnvSection)
    algorithm: AlgorithmSection = dataclasses.field(default_factory=AlgorithmSection)
    trainer: TrainerSection = dataclasses.field(default_factory=TrainerSection)
    ray: RaySection = dataclasses.field(default_factory=RaySection)
    judge: JudgeSection = dataclasses.field(default_factory=JudgeSection)


def ranks(cfg: Config, role: str) -> int:
    """The world size of the actor, ref, teacher or critic (each section resolves "auto" when it is built); 1
    for the other services."""
    world = {
        "actor": cfg.actor.world_size,
        "ref": cfg.ref.world_size,
        "teacher": cfg.teacher.world_size,
        "critic": cfg.critic.world_size,
    }.get(role, 1)
    assert isinstance(world, int)  # "auto" -> a number in the section's __post_init__
    return world


SECTIONS: dict[str, type[Checked]] = typing.get_type_hints(Config)  # section name -> its class


def from_dict(raw: dict) -> Config:
    if not isinstance(raw, dict):
        raise ValueError(f"a config is a mapping of sections, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ValueError(
            f"unknown config section(s) {unknown}; known: {sorted(SECTIONS)}"
            f"{verl_keys.hints({k: raw[k] for k in unknown})}"  # verl's sections, OpenRLHF's flat keys too
        )
    sections = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{name}: a section is a mapping of keys, got {values!r}")
        try:
            sections[name] = build(cls, values, name)
        except ValueError as e:
            known = {f.name for f in dataclasses.fields(cls)}
            strange = {k: v for k, v in values.items() if k not in known}  # the section's own keys need no hint
            hints = verl_keys.hints({name: strange})
            typos = "" if hints else "".join(did_you_mean(f"{name}.{k}") for k in strange)
            raise ValueError(f"{e}{hints}{typos}") from None
    return Config(**sections)


def apply_override(raw: dict, override: str) -> None:
    """Set `section.key=value` in raw; the value is read as YAML and fitted to the field's type."""
    key, sep, text = override.partition("=")
    parts = key.strip().split(".")
    verl = verl_keys.hint(key.strip())
    if not sep or len(parts) != 2 or not all(parts):
        raise ValueError(f"override {override!r} must look like section.key=value{verl}")
    section, name = parts
    typo = "" if verl else did_you_mean(key.strip())
    if section not in SECTIONS:
        raise ValueError(f"override {override!r}: unknown section {section!r}{typo}; known: {sorted(SECTIONS)}{verl}")
    hints = typing.get_type_hints(SECTIONS[section])
    if name not in hints:
        raise ValueError(f"override {override!r}: unknown key {section}.{name}{typo}; known: {sorted(hints)}{verl}")
    try:
        value = read_yaml(text) if text.strip() else ""
    except yaml.YAMLError as e:
        if hints[name] is not str:
            raise ValueError(f"override {override!r}: the value is not YAML ({str(e).splitlines()[0]})") from None
        value = text.strip()  # a text key: a template's {field} is text, not a YAML mapping
    if hints[name] is str and not isinstance(value, str) and value is not None:
        value = text.strip()  # model=123 is a path, not a number; template={prompt} is text
    raw.setdefault(section, {})
    if raw[section] is None:
        raw[section] = {}
    raw[section][name] = value


def did_you_mean(key: str) -> str:
    """' (did you mean SECTION.KEY?)' for the known key closest to a mistyped one (in any section:
    `actor.temperature` is rollout.temperature); '' where none is close."""
    known = [f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def load_config(path: str | None, overrides: Sequence[str] = ()) -> Config:
    raw: dict = {}
    if path:
        file = pathlib.Path(path)
        if not file.is_file():
            raise ValueError(f"config file {path} not found")
        text = file.read_text()
        verl = verl_keys.convert_first(path, text)  # one line rather than each of its keys as unknown
        if verl:
            raise ValueError(verl)
        raw = read_yaml(text) or {}
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
        own = set(cls.__dict__.get("__annotations__", {}))  # the section's own keys first, then the service's
        for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
            head = f"  {name}.{f.name}={shown}"
            doc = docs.get(f.name, "")
            out.append(textwrap.fill(f"{head}  {doc}" if doc else head, width, subsequent_indent=" " * 6))
    return "\n".join(out)


def save_config(cfg: Config, path: str | pathlib.Path) -> None:
    pathlib.Path(path).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
