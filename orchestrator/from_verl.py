"""`meshrl config from-verl FILE.yaml`: the meshrl config for a verl PPO/GRPO YAML, and what has no equivalent.

    command, config, left = convert(yaml.safe_load(text))   # "grpo", {"actor": {"lr": 1e-6}, ...}, [...]
    print(render(command, config, left, source))

Keys map one by one (verl_keys.VERL_KEYS, plus the verl keys whose name and meaning are ours, e.g.
algorithm.gamma); a few need their value translated (a reward function's path and name, verl's engine
and loss names, resume modes). OmegaConf references (${data.max_response_length}) are resolved from the
same file. algorithm.adv_estimator picks the command (gae: ppo, grpo, rloo, reinforce_plus_plus:
reinforce). Every mapped value is checked by loading it into our config; a value ours refuses, a key
with no equivalent and an unresolved reference are listed with the reason, never dropped in silence.
"""

import dataclasses
import re

import yaml

from orchestrator.config import SECTIONS, load_config
from orchestrator.verl_keys import VERL_KEYS

COMMANDS = {
    "gae": "ppo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce",
    "reinforce_plus_plus_baseline": "reinforce",
}
ENGINES = {"fsdp": "fsdp1", "fsdp2": "fsdp2"}
LOSSES = {"vanilla": "ppo", "gspo": "gspo"}
KL = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}  # k3: clamped
KL_KEYS = {"actor_rollout_ref.actor.kl_loss_type": "actor.kl_loss_type", "algorithm.kl_penalty": "algorithm.kl_penalty"}
NOTES = {  # why a common verl key has no equivalent
    "data.filter_overlong_prompts": "always on here: longer prompts are dropped and counted",
    "trainer.total_epochs": "set trainer.total_steps (steps, not epochs)",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "the rollout's own log-probs are used",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "the ref sizes its passes by actor.micro_batch_*",
}
WITH_ANOTHER = (  # verl keys that take effect through another key's mapping, not left out
    "algorithm.adv_estimator",  # the command
    "custom_reward_function.name",  # with the path
    "reward_model.overlong_buffer.enable",  # with the length
    "reward_model.overlong_buffer.log",  # the penalty's metrics are logged always
)
REFERENCE = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")
SKIP = (
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
)  # where verl's run is placed and named: a meshrl run has its folder (trainer.run_dir) and its services


def flatten(raw: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def resolve(value: object, flat: dict[str, object], depth: int = 0) -> object:
    """A value with ${a.b} replaced by the file's a.b (a reference to a reference too); ValueError when
    it names a key the file lacks or a resolver (${oc.env:...})."""
    if not isinstance(value, str) or "${" not in value:
        return value
    m = REFERENCE.match(value.strip())
    if not m or m.group(1) not in flat or depth > 8:
        raise ValueError(f"the reference {value} is not resolved here")
    return resolve(flat[m.group(1)], flat, depth + 1)


OURS = {f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}  # every key of ours


def translate(key: str, value: object, flat: dict[str, object]) -> dict[str, object]:
    """{our key: value} for one verl key (empty: it has no equivalent); ValueError for a value that does."""
    if key == "actor_rollout_ref.actor.clip_ratio":
        return {"actor.clip_ratio_low": value, "actor.clip_ratio_high": value}
    if key == "custom_reward_function.path":
        name = flat.get("custom_reward_function.name") or "compute_score"
        return {"reward.function": f"{value}:{name}"} if value else {}
    if key == "custom_reward_function.name":
        return {}  # with the path
    if key == "reward_model.reward_manager":
        return {"reward.batched": value == "batch"}
    if key == "trainer.resume_mode":
        return {"trainer.resume": value != "disable"}
    if key == "actor_rollout_ref.actor.strategy":
        if value not in ENGINES:
            raise ValueError(f"no engine here for verl's strategy {value!r} (ours: fsdp2, fsdp1, plain)")
        return {"actor.engine": ENGINES[str(value)]}
    if key == "actor_rollout_ref.actor.policy_loss.loss_mode":
        if value not in LOSSES:
            raise ValueError(f"no policy loss here for verl's {value!r} (ours: ppo, gspo)")
        return {"actor.policy_loss": LOSSES[str(value)]}
    if key == "actor_rollout_ref.rollout.name" and value not in ("vllm", "hf"):
        raise ValueError(f"no rollout backend here for {value!r} (ours: vllm, hf)")
    if key == "algorithm.adv_estimator":
        return {}  # the command
    if key in KL_KEYS:
        if value not in KL:
            raise ValueError(f"no KL estimate here for verl's {value!r} (ours: k1, k2, k3, abs)")
        return {KL_KEYS[key]: KL[str(value)]}
    if key == "reward_model.overlong_buffer.len":  # DAPO's soft overlong penalty, on where verl enables it
        if not flat.get("reward_model.overlong_buffer.enable"):
            raise ValueError("verl's overlong buffer is off in this file (enable: false): ours stays off")
        return {"algorithm.overlong_buffer": value}
    if key in ("data.train_files", "data.val_files") and isinstance(value, list):
        if len(value) != 1:
            raise ValueError(f"{len(value)} files: {key} here names one data file (parquet, jsonl, json, a folder)")
        return {key: value[0]}
    target = VERL_KEYS.get(key, key if key in OURS else None)
    if target is None:
        return {}
    return {target.split(" ")[0]: value}


def convert(raw: dict) -> tuple[str, dict[str, dict], list[tuple[str, object, str]]]:
    """(command, our config as sections, [(verl key, value, why it is left out)])."""
    flat = flatten(raw)
    estimator = flat.get("algorithm.adv_estimator", "gae")
    command = COMMANDS.get(str(estimator), "")
    left: list[tuple[str, object, str]] = []
    if not command:
        left.append(("algorithm.adv_estimator", estimator, f"no command here for it (ours: {sorted(COMMANDS)})"))
        command = "grpo"
    config: dict[str, tuple[str, object, object]] = {}  # our key -> (verl key, its value, ours)
    for key, value in flat.items():
        if key in SKIP:
            left.append((key, value, "verl's placement and naming: not a setting here"))
            continue
        try:
            value = resolve(value, flat)
            mapped = translate(key, value, flat)
        except ValueError as e:
            left.append((key, value, str(e)))
            continue
        if not mapped:
            if key not in WITH_ANOTHER:
                left.append((key, value, NOTES.get(key, "no equivalent")))
            continue
        for ours_key, v in mapped.items():
            if v is not None:  # verl's "unset": ours keeps its default
                config.setdefault(ours_key, (key, value, v))
    r = config.get("rollout.max_new_tokens")
    prompt = config.get("data.max_prompt_length")
    if r and prompt and "rollout.max_model_len" not in config:  # verl sizes the engine from the two
        if isinstance(r[2], int) and isinstance(prompt[2], int):
            config["rollout.max_model_len"] = ("data.max_prompt_length", prompt[1], prompt[2] + r[2])
    while True:  # every value checked together (some rules cross keys); one ours refuses is left out, named
        try:
            load_config(
                None, [f"{k}={yaml.safe_dump(v[2], default_flow_style=True).strip()}" for k, v in config.items()]
            )
            break
        except ValueError as e:
            named = [k for k in config if k in str(e)] or list(config)[-1:]
            verl_key, value, _ = config.pop(named[0])
            left.append((verl_key, value, f"{named[0]}: {e}"))
    sections: dict[str, dict] = {}
    for k, (_, _, v) in config.items():
        section, name = k.split(".", 1)
        sections.setdefault(section, {})[name] = v
    return command, sections, left


def render(command: str, config: dict[str, dict], left: list[tuple[str, object, str]], source: str) -> str:
    head = [
        f"# meshrl config from the verl config {source} (meshrl config from-verl)",
        f"# run it with: meshrl {command} --config THIS_FILE [section.key=value ...]",
    ]
    body = yaml.safe_dump(config, sort_keys=False).rstrip() if config else "{}"
    tail = ["", f"# {len(left)} verl key(s) left out:"] if left else []
    tail += [f"#   {key}: {value!r}: {why}" for key, value, why in left]
    return "\n".join([*head, body, *tail]) + "\n"
