"""`meshrl config from-verl FILE`: the meshrl config for a verl PPO/GRPO config, a YAML file or a launch
script (`python3 -m verl.trainer.main_ppo key=value ...`, orchestrator/verl_script.py), and what has no
equivalent.

    conversion = convert(*read(text))   # .command "grpo", .config {"actor": {"lr": 1e-6}, ...}, .left [...]
    print(render(conversion, source))

It converts to the run verl would make of the file, not to its words:
- a key the file does not set takes verl's default (verl_defaults), not ours: verl samples rollout.n=1;
- verl counts ppo_mini_batch_size in prompts and multiplies it by rollout.n before splitting a batch
  (verl/trainer/ppo/ray_trainer.py; verl/workers/fsdp_workers.py before), ours counts rows: verl's
  run_qwen2-7b (1024 prompts x 5, mini-batches of 256 prompts) takes 4 optimizer steps a batch, as here;
- values verl reads in its own way are translated: save_freq/test_freq -1 ("never"), lr_warmup_steps <= 0
  (the ratio's), clip_ratio (ignored where clip_ratio_low/high are set), ppo_max_token_len_per_gpu (only
  with use_dynamic_bsz), DAPO's filter_groups.metric seq_reward (our score), a reward function's path and
  name, verl's engine, loss and KL names.
Keys map one by one (verl_keys.VERL_KEYS, plus verl keys whose name and meaning are ours, e.g.
algorithm.gamma); OmegaConf references (${data.max_response_length}) are resolved from the same file;
algorithm.adv_estimator picks the command. Each value is checked by loading it into our config on its own
(and with the others, for the rules ours checks across keys), so a value ours refuses leaves out only
itself. What is left out (no equivalent, refused, unresolved, a script value that needs the shell) is
listed with its reason, never dropped in silence. A launch script is read as the shell runs it
(orchestrator/verl_script.py); where a setting's value needs the shell (a command's output, the
environment), a path, a name or an engine size is left out (listed, for the user to set), and any other
setting that maps to ours refuses the conversion in one line: no default stands in for what decides training.
"""

import dataclasses
import re
from collections.abc import Callable

import yaml

from meshrl.config.actor import ENGINE_NAMES
from meshrl.config.losses import KL_ESTIMATORS
from meshrl.config.rollout import BACKENDS
from orchestrator.config import LOGGERS, SECTIONS, from_dict, read_yaml
from orchestrator.verl_defaults import CRITIC_DEFAULTS, VERL_DEFAULTS
from orchestrator.verl_keys import VERL_KEYS, hint
from orchestrator.verl_script import is_script, read_script

COMMANDS = {
    "gae": "ppo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce",
    "reinforce_plus_plus_baseline": "reinforce",
}
ENGINES = {"fsdp": "fsdp1", "fsdp2": "fsdp2"}
LOSSES = {  # verl's policy_loss.loss_mode -> ours (meshrl/config/losses.py POLICY_LOSSES)
    "vanilla": "ppo",
    "gspo": "gspo",
    "cispo": "cispo",
    "geo_mean": "gmpo",
    "sapo": "sapo",
    "clip_cov": "clip_cov",
    "kl_cov": "kl_cov",
}
KL = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}  # k3: clamped
KL_KEYS = {"actor_rollout_ref.actor.kl_loss_type": "actor.kl_loss_type", "algorithm.kl_penalty": "algorithm.kl_penalty"}
GROUP_METRICS = {"acc": "acc", "score": "score", "seq_reward": "score"}  # seq_reward: the sum of a sample's
#   token-level scores, i.e. its score (on its last token); verl's DAPO reward manager has added the
#   overlong penalty to it by then, ours adds the penalty after the groups are judged
ALIASES = {  # other spellings of the same keys: DAPO's reward kwargs, verl's newer reward section
    "reward_model.reward_kwargs.overlong_buffer_cfg.": "reward_model.overlong_buffer.",
    "reward.reward_kwargs.overlong_buffer_cfg.": "reward_model.overlong_buffer.",
    "reward.reward_kwargs.": "reward_model.reward_kwargs.",
    "reward.custom_reward_function.": "custom_reward_function.",
    "reward.reward_manager.name": "reward_model.reward_manager",
}
MINI = "actor_rollout_ref.actor.ppo_mini_batch_size"
N = "actor_rollout_ref.rollout.n"
FIRST = ("actor_rollout_ref.rollout.response_length",)  # verl generates this many; data's is its default
NOTES = {  # why a common verl key has no equivalent
    "algorithm.rollout_correction.bypass_mode": "the old log-probs are the actor's, the rollout's correct them",
    "algorithm.rollout_correction.rollout_is_batch_normalize": "the weights are used as they are, not normalized",
    "data.filter_overlong_prompts": "always on here: longer prompts are dropped and counted",
    "data.gen_batch_size": "dynamic sampling here samples each round as data.train_batch_size prompts",
    "trainer.total_epochs": "set trainer.total_steps (steps, not epochs)",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "the rollout's own log-probs are used",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "the ref sizes its passes by actor.micro_batch_*",
    "critic.ppo_mini_batch_size": "the critic's update walks the batch as the actor's (actor.mini_batch_size)",
    "reward_model.reward_kwargs.max_resp_len": "the response limit is rollout.max_new_tokens",
    # verl's SAPO loss reads actor_rollout_ref.actor.tau_pos/tau_neg (core_algos.compute_policy_loss_sapo);
    # its examples' +policy_loss.tau_pos adds a key nothing reads
    "actor_rollout_ref.actor.policy_loss.tau_pos": "verl reads actor_rollout_ref.actor.tau_pos, not this",
    "actor_rollout_ref.actor.policy_loss.tau_neg": "verl reads actor_rollout_ref.actor.tau_neg, not this",
}
WITH_ANOTHER = (  # verl keys that take effect through another key's mapping, not left out
    "algorithm.adv_estimator",  # the command
    "custom_reward_function.name",  # with the path
    "reward_model.overlong_buffer.enable",  # with the length
    "reward_model.overlong_buffer.log",  # the penalty's metrics are logged always
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",  # with lr_warmup_steps
    "actor_rollout_ref.actor.use_dynamic_bsz",  # with ppo_max_token_len_per_gpu
)
REFERENCE = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")
SKIP = (
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
)  # where verl's run is placed and named: a meshrl run has its folder (trainer.run_dir) and its services
PLACEMENT = "verl's placement and naming: not a setting here"
MACHINE = (  # a script value that needs the shell is left out (listed) for these, which describe a machine:
    "actor_rollout_ref.model.path",  # paths, where metrics go, the engines' sizes; any other key that maps
    "critic.model.path",  # to ours refuses the conversion, as a default would stand in for it
    "data.train_files",
    "data.val_files",
    "custom_reward_function.path",
    "trainer.default_local_dir",
    "trainer.logger",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.enforce_eager",
)
OURS = {f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}  # every key of ours
Left = tuple[str, object, str]  # (verl key, its value, why it is left out)


@dataclasses.dataclass
class Conversion:
    command: str  # meshrl's command for the file's algorithm.adv_estimator
    config: dict[str, dict]  # our config, as sections
    left: list[Left]
    defaults: list[tuple[str, object]]  # (verl key, verl's default) for the keys the file does not set
    derived: list[str]  # values computed the way verl computes them, said how
    assumed: list[str] = dataclasses.field(default_factory=list)  # how a script was read (its defaults taken)


def flatten(raw: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def alias(key: str) -> str:
    for spelling, ours in ALIASES.items():
        if key.startswith(spelling):
            return ours + key[len(spelling) :]
    return key


def read(text: str) -> tuple[dict[str, object], dict[str, tuple[str, str]], list[str]]:
    """(the flat verl config, {key: (as written, why it is not read)}, [how a script was read]) of a verl
    YAML or launch script."""
    try:
        raw = read_yaml(text)
    except yaml.YAMLError:
        raw = None
    if isinstance(raw, dict):
        return flatten(raw), {}, []
    if is_script(text):
        overrides, unread, assumed = read_script(text)
        return flatten(overrides), unread, assumed
    raise ValueError("not a YAML mapping (a verl config) nor a verl launch script (python3 -m verl.trainer.main_ppo)")


def resolve(value: object, flat: dict[str, object], depth: int = 0) -> object:
    """A value with ${a.b} replaced by the file's a.b (a reference to a reference too); ValueError when
    it names a key the file lacks or a resolver (${oc.env:...})."""
    if not isinstance(value, str) or "${" not in value:
        return value
    m = REFERENCE.match(value.strip())
    if not m or m.group(1) not in flat or depth > 8:
        raise ValueError(f"the reference {value} is not resolved here")
    return resolve(flat[m.group(1)], flat, depth + 1)


def mini_batch(value: object, flat: dict[str, object]) -> dict[str, object]:
    """actor.mini_batch_size in rows: verl's ppo_mini_batch_size (prompts) x rollout.n, as verl computes it."""
    if value is None:
        return {}
    n = resolve(flat[N], flat)
    if type(value) is not int or type(n) is not int or value < 1 or n < 1:
        raise ValueError(f"verl's mini-batch of {value!r} prompts x rollout.n={n!r} is not a number of rows")
    return {"actor.mini_batch_size": value * n}


def clip_ratio(value: object, flat: dict[str, object]) -> dict[str, object]:
    """verl's losses take clip_ratio_low/high where they are not None, clip_ratio otherwise."""
    sides = {s: flat.get(f"actor_rollout_ref.actor.clip_ratio_{s}") for s in ("low", "high")}
    taken = {f"actor.clip_ratio_{s}": value for s, v in sides.items() if v is None or v == value}
    if not taken:
        raise ValueError(f"verl's losses take clip_ratio_low and clip_ratio_high ({sides['low']}, {sides['high']})")
    return taken


def rollout_is_threshold(value: object, flat: dict[str, object]) -> dict[str, object]:
    """TIS's cap, or IcePop's "lower_upper" band (a mask)."""
    lower, _, upper = str(value).rpartition("_")
    band = {"algorithm.rollout_is_mode": "mask", "algorithm.rollout_is_floor": float(lower)} if lower else {}
    return {"algorithm.rollout_is_cap": float(upper), **band}


def warmup(value: object, flat: dict[str, object]) -> dict[str, object]:
    """lr_warmup_steps <= 0: verl warms up lr_warmup_steps_ratio of its steps."""
    if not isinstance(value, int) or value > 0:
        return {"actor.warmup_steps": value}
    ratio = flat.get("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio") or 0
    total = flat.get("trainer.total_training_steps")
    if ratio and not isinstance(total, int):
        raise ValueError(f"verl warms up lr_warmup_steps_ratio={ratio} of its steps: set actor.warmup_steps")
    fraction = float(ratio) if isinstance(ratio, int | float) else 0.0
    return {"actor.warmup_steps": int(fraction * total) if fraction and isinstance(total, int) else 0}


def token_budget(value: object, flat: dict[str, object]) -> dict[str, object]:
    if not flat.get("actor_rollout_ref.actor.use_dynamic_bsz"):
        raise ValueError("verl uses it only with actor_rollout_ref.actor.use_dynamic_bsz=true")
    return {"actor.micro_batch_tokens": value}


def every(ours: str) -> Callable[[object, dict], dict[str, object]]:
    """save_freq / test_freq: <= 0 is verl's "never", ours 0."""
    return lambda value, flat: {ours: max(value, 0) if isinstance(value, int) else value}


def group_metric(value: object, flat: dict[str, object]) -> dict[str, object]:
    if value == "seq_final_reward" and not flat.get("algorithm.use_kl_in_reward"):
        value = "seq_reward"  # the same sums where no KL penalty is in the reward
    if value is not None and value not in GROUP_METRICS:
        raise ValueError(f"no group metric here for verl's {value!r} (ours: acc, score = verl's seq_reward)")
    return {"algorithm.dynamic_sampling_metric": GROUP_METRICS.get(str(value))}


def max_rounds(value: object, flat: dict[str, object]) -> dict[str, object]:
    if isinstance(value, int) and value <= 0:
        raise ValueError("verl's no limit: ours samples algorithm.max_sample_rounds rounds at most (default 8)")
    return {"algorithm.max_sample_rounds": value}


def loggers(value: object, flat: dict[str, object]) -> dict[str, object]:
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else []
    if not any(name in LOGGERS for name in names):
        raise ValueError(f"no logger here for {names} (ours: {', '.join(LOGGERS)})")
    return {"trainer.logger": [name for name in names if name in LOGGERS]}


def reward_function(value: object, flat: dict[str, object]) -> dict[str, object]:
    name = flat.get("custom_reward_function.name") or "compute_score"
    return {"reward.function": f"{value}:{name}"} if value else {}


def named(
    what: str, names: dict, key: str, ours: tuple = (), of: str = ""
) -> Callable[[object, dict], dict[str, object]]:
    """A verl name for one of ours (names: verl's -> ours); a refusal lists ours, or verl's names taken."""

    def convert(value: object, flat: dict[str, object]) -> dict[str, object]:
        if value not in names:
            known = f"ours: {', '.join(ours)}" if ours else f"verl's we take: {', '.join(names)}"
            raise ValueError(f"no {what} here for verl's {of}{value!r} ({known})")
        return {key: names[str(value)]}

    return convert


def rollout_name(value: object, flat: dict[str, object]) -> dict[str, object]:
    if value not in BACKENDS:
        raise ValueError(f"no rollout backend here for {value!r} (ours: {', '.join(BACKENDS)})")
    return {"rollout.backend": value}


def overlong(value: object, flat: dict[str, object]) -> dict[str, object]:
    """DAPO's soft overlong penalty, on where verl enables it."""
    if not flat.get("reward_model.overlong_buffer.enable"):
        raise ValueError("verl's overlong buffer is off in this file (enable: false): ours stays off")
    return {"algorithm.overlong_buffer": value}


def one_file(key: str) -> Callable[[object, dict], dict[str, object]]:
    def convert(value: object, flat: dict[str, object]) -> dict[str, object]:
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError(f"{len(value)} files: {key} here names one data file (parquet, jsonl, json, a folder)")
            value = value[0]
        return {key: value}

    return convert


CONVERSIONS: dict[str, Callable[[object, dict], dict[str, object]]] = {  # verl keys read in verl's own way
    "actor_rollout_ref.actor.clip_ratio": clip_ratio,
    "algorithm.rollout_correction.rollout_is": lambda v, f: {"algorithm.rollout_is": "none" if v is None else v},
    "algorithm.rollout_correction.rollout_is_threshold": rollout_is_threshold,
    "algorithm.rollout_correction.rollout_rs": lambda v, f: {"algorithm.rollout_rs": "" if v is None else str(v)},
    "algorithm.rollout_correction.rollout_rs_threshold": lambda v, f: {
        "algorithm.rollout_rs_threshold": "" if v is None else str(v)
    },
    "actor_rollout_ref.actor.optim.lr_warmup_steps": warmup,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": token_budget,
    "trainer.save_freq": every("trainer.save_every"),
    "trainer.test_freq": every("trainer.val_every"),
    "algorithm.filter_groups.metric": group_metric,
    "algorithm.filter_groups.max_num_gen_batches": max_rounds,
    "trainer.logger": loggers,
    "custom_reward_function.path": reward_function,
    "reward_model.reward_manager": lambda v, f: {"reward.batched": v == "batch"},
    "trainer.resume_mode": lambda v, f: {"trainer.resume": v != "disable"},
    "actor_rollout_ref.actor.strategy": named("engine", ENGINES, "actor.engine", ENGINE_NAMES, "strategy "),
    "actor_rollout_ref.actor.policy_loss.loss_mode": named("policy loss", LOSSES, "actor.policy_loss"),
    "actor_rollout_ref.rollout.name": rollout_name,
    **{key: named("KL estimate", KL, ours, KL_ESTIMATORS) for key, ours in KL_KEYS.items()},
    "reward_model.overlong_buffer.len": overlong,
    "data.train_files": one_file("data.train_files"),
    "data.val_files": one_file("data.val_files"),
}


def translate(key: str, value: object, flat: dict[str, object]) -> dict[str, object]:
    """{our key: value} for one verl key (empty: it has no equivalent); ValueError for a value that does."""
    if key == MINI:
        return mini_batch(value, flat)
    if key in CONVERSIONS:
        return CONVERSIONS[key](value, flat)
    if key in WITH_ANOTHER:
        return {}
    target = VERL_KEYS.get(key, key if key in OURS else None)
    return {target.split(" ")[0]: value} if target else {}


def checked(config: dict[str, tuple[str, object, object]]) -> tuple[list[str], list[tuple[str, str]]]:
    """(our keys that load, [(our key, why not)]). Each key is loaded on its own first, so that one value
    ours refuses leaves out only itself; a key refused alone is tried again with those that load (ours
    checks a few together: max_new_tokens within max_model_len), and keys that load alone but clash lose
    the one whose leaving ends the clash."""

    def refused(keys: list[str]) -> str:
        sections: dict[str, dict] = {}
        for k in keys:
            section, name = k.split(".", 1)
            sections.setdefault(section, {})[name] = config[k][2]
        try:
            from_dict(sections)
        except ValueError as e:
            return str(e)
        return ""

    alone = {k: refused([k]) for k in config}
    kept = [k for k in config if not alone[k]]
    out: list[tuple[str, str]] = []
    while why := refused(kept):
        named = [k for k in kept if k in why]  # a key the error names goes first, one at a time: a loss
        others = [k for k in reversed(kept) if k not in why]  # refusing two unread settings keeps the loss
        ends = [k for k in named + ([] if named else others) if not refused([x for x in kept if x != k])]
        culprit = (ends or named or others)[0]
        kept.remove(culprit)
        out.append((culprit, why))
    for k in (k for k in config if alone[k]):
        why = refused([*kept, k])
        if why:
            out.append((k, why))
        else:
            kept.append(k)
    return kept, out


def mapped(
    flat: dict[str, object], defaults: set[str]
) -> tuple[dict[str, tuple[str, object, object]], list[Left], list[tuple[str, object]]]:
    """({our key: (verl key, its value, ours)}, the keys left out, the defaults that took effect) for a flat
    verl config with verl's defaults filled in (`defaults` names those: one ours cannot take is not listed,
    as the file never set it)."""
    left: list[Left] = []
    carried: list[tuple[str, object]] = []
    config: dict[str, tuple[str, object, object]] = {}
    for key in sorted(flat, key=lambda k: k not in FIRST):
        value, given = flat[key], key not in defaults
        if key in SKIP:
            left.append((key, value, PLACEMENT))
            continue
        try:
            value = resolve(value, flat)
            ours = translate(key, value, flat)
        except ValueError as e:
            left += [(key, value, str(e))] if given else []
            continue
        if not ours and key not in WITH_ANOTHER:
            left += [(key, value, NOTES.get(key, "no equivalent"))] if given else []
            continue
        if key == "trainer.logger" and isinstance(value, (str, list)):
            others = [name for name in ([value] if isinstance(value, str) else value) if name not in LOGGERS]
            left += [(key, others, f"no logger here for them (ours: {', '.join(LOGGERS)})")] if others else []
        took = key in WITH_ANOTHER
        for k, v in ours.items():
            if v is None:  # verl's "unset": ours keeps its default
                continue
            if k not in config:
                config[k], took = (key, value, v), True
            elif config[k][2] != v and given:
                left.append((key, value, f"{k} is taken from {config[k][0]} ({config[k][2]!r})"))
        carried += [] if given or not took else [(key, value)]
    return config, left, carried


def matters(key: str, defaults: dict[str, object]) -> bool:
    """Whether a value not known here would leave a default standing in for what decides training."""
    if key in SKIP or key in MACHINE or key in NOTES:
        return False
    return key in VERL_KEYS or key in CONVERSIONS or key in OURS or key in defaults or key in WITH_ANOTHER


def convert(
    flat: dict[str, object], unread: dict[str, tuple[str, str]] | None = None, assumed: list[str] | None = None
) -> Conversion:
    """The conversion of a flat verl config ({dotted key: value}, as read) whose `unread` keys are set to
    values not known here (a launch script's shell variables): no default stands in for those, a training
    setting among them refuses it (ValueError)."""
    flat = {alias(k): v for k, v in flat.items()}
    unread = {alias(k): v for k, v in (unread or {}).items()}
    own = {**VERL_DEFAULTS, **CRITIC_DEFAULTS}
    for key, (text, why) in unread.items():
        if matters(key, own) or key == "algorithm.adv_estimator":
            raise ValueError(f"{key}={text} {why}: write the value into the script to convert it")
    estimator = flat.get("algorithm.adv_estimator", "gae")
    command = COMMANDS.get(str(estimator), "")
    left: list[Left] = []
    if not command:
        left.append(("algorithm.adv_estimator", estimator, f"no command here for it (ours: {sorted(COMMANDS)})"))
        command = "grpo"
    for key, (text, why) in unread.items():
        left.append((key, text, PLACEMENT if key in SKIP else why + hint(key)))
    own = {**VERL_DEFAULTS, **(CRITIC_DEFAULTS if command == "ppo" else {})}
    defaults = {k: v for k, v in own.items() if k not in flat and k not in unread}
    if not {"trainer.total_epochs", "trainer.total_training_steps"} & (set(flat) | set(unread)):
        left.append(("trainer.total_epochs", 30, f"verl's default: {NOTES['trainer.total_epochs']}"))
    config, more, carried = mapped({**flat, **defaults}, set(defaults))
    derived = derive(config)
    kept, refused = checked(config)
    left += more + [(config[k][0], config[k][1], f"{k}: {why}") for k, why in refused]
    sections: dict[str, dict] = {}
    for k in (k for k in config if k in kept):
        section, name = k.split(".", 1)
        sections.setdefault(section, {})[name] = config[k][2]
    derived = [d for d in derived if d.split(":")[0] in kept]
    return Conversion(command, sections, left, carried, derived, list(assumed or []))


def derive(config: dict[str, tuple[str, object, object]]) -> list[str]:
    """Values verl computes from others, added to config where the file does not set ours; how each came."""
    out = []
    new, prompt = config.get("rollout.max_new_tokens"), config.get("data.max_prompt_length")
    if new and prompt and "rollout.max_model_len" not in config:  # verl sizes the engine from the two
        if isinstance(new[2], int) and isinstance(prompt[2], int):
            config["rollout.max_model_len"] = ("data.max_prompt_length", prompt[1], prompt[2] + new[2])
            total = prompt[2] + new[2]
            out.append(f"rollout.max_model_len: {total} = data.max_prompt_length {prompt[2]} + the response's {new[2]}")
    mini = config.get("actor.mini_batch_size")
    if mini and isinstance(mini[1], int) and isinstance(mini[2], int) and mini[1] != mini[2]:
        out.append(
            f"actor.mini_batch_size: {mini[2]} rows = verl's ppo_mini_batch_size {mini[1]} prompts x rollout.n "
            f"{mini[2] // mini[1]} (verl counts a mini-batch in prompts, ours in rows)"
        )
    return out


def render(conversion: Conversion, source: str) -> str:
    c = conversion
    head = [
        f"# meshrl config from the verl config {source} (meshrl config from-verl)",
        f"# run it with: meshrl {c.command} --config THIS_FILE [section.key=value ...]",
    ]
    body = yaml.safe_dump(c.config, sort_keys=False).rstrip() if c.config else "{}"
    tail = ["", "# the script read as the shell runs it, taking:"] if c.assumed else []
    tail += [f"#   {line}" for line in c.assumed]
    tail += ["", "# computed as verl computes them:"] if c.derived else []
    tail += [f"#   {line}" for line in c.derived]
    tail += ["", f"# verl's defaults for {len(c.defaults)} key(s) the file does not set:"] if c.defaults else []
    tail += [f"#   {key}: {value!r}" for key, value in c.defaults]
    tail += ["", f"# {len(c.left)} verl key(s) left out:"] if c.left else []
    tail += [f"#   {key}: {value!r}: {why}" for key, value, why in c.left]
    return "\n".join([*head, body, *tail]) + "\n"
