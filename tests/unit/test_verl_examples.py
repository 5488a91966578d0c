"""`meshrl config from-verl` over launch scripts in the shapes verl's examples take
(tests/unit/data/verl_launch/, written for these tests: see its README.md): each converts, with every
setting as the shell would give it, or is refused in one line naming what could not be read; none converts
with a shell variable silently dropped or left unexpanded. The expected values below were computed by hand
from each script and checked once against bash itself, running each script with no environment but PATH
and HOME and with stand-ins for python3/uv/srun/conda that print the verl command's arguments: bash gave
every setting the reader reads, with the same value."""

import pathlib
import re

import pytest
import yaml

from cli.main import main
from orchestrator.config import load_config
from orchestrator.from_verl import LOSSES, alias, convert, read
from orchestrator.verl_script import read_script

ROOT = pathlib.Path(__file__).parent / "data" / "verl_launch"
SCRIPTS = sorted(p.name for p in ROOT.glob("*.sh"))
REFUSED = {  # script: what its one-line refusal names
    # DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' ...)}, then a case on it sets the batch: GPU or NPU
    "device_probe_refused.sh": "which depends on DEVICE (line 6: `$(python3 -c 'import torch_npu'",
    # MODEL_PATH=${MODEL_PATH:-${MOE_A_PATH:-}} then `: "${MODEL_PATH:?...}"`: bash stops there too
    "model_path_required_refused.sh": "line 15: the script stops without MODEL_PATH: give MODEL_PATH",
    # EXTRA+=(...) under `if [ -n "$RESUME_FROM" ]`: which settings "${EXTRA[@]}" gives is not known
    "resume_branch_refused.sh": "which verl settings `${EXTRA[@]}` gives needs EXTRA, set under `if [ -n",
}
UNEXPANDED = re.compile(r"\$(\{|\(|[A-Za-z_@*#?0-9])")  # a shell expansion left in a value
VERL = (  # the settings TABLE checks, as verl's keys
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.actor.optim.lr",
)
Row = tuple[str, str | None, int | None, int, int, int, int, float]
TABLE: dict[
    str, Row
] = {  # script: (our command, then VERL's values as bash gives them; None: the script does not set it)
    "sapo_unquoted_configs.sh": ("grpo", "sapo", 8, 128 // 4, 128, 1024 * 2, 1024 * 6, 2e-6),
    "grpo_array_knobs.sh": ("grpo", None, 5, 64, 512, 1024, 1024 * 3, 1e-6),
    "rloo_functions.sh": ("rloo", None, 4, 256 // 8, 256, 512, 512 * 3, 1e-6),
    "reinforce_pp_heredocs.sh": ("reinforce", None, 8, 128, 512, 1024, 2048, 3e-6),
    "gmpo_continuations.sh": ("grpo", "geo_mean", 6, 48, 192, 256 * 3, 256 * 3 * 3, 1e-6),
    "ppo_megatron_critic.sh": ("ppo", None, None, 64, 256, 1024, 2048, 1e-6),
    "gspo_model_engine.sh": ("grpo", "gspo", 12, 96 // 4, 96, 512 * 3, 1024 * 6, 5e-7),
    "cispo_fsdp.sh": ("grpo", "cispo", 5, 128, 512, 1024, 2048, 1e-6),
    "dapo_dynamic_sampling.sh": ("grpo", None, 16, 32, 256, 1024 * 2, 1024 * 4, 1e-6),
    "rloo_rollout_correction.sh": ("rloo", None, None, 16, 64, 1024, 3072, 5e-7),
    "lora_token_budget.sh": ("grpo", None, 4, 16, 64, 512, 1024, 3e-6),
    "remax_parameter_forms.sh": ("grpo", None, 4, 64, 256, 512, 1024, 1e-6),  # remax: no command, listed
}
OURS: dict[str, dict[str, object]] = {  # further settings of ours a script gives, as converted
    "sapo_unquoted_configs.sh": {
        "actor.tau_pos": 1.0,
        "actor.tau_neg": 1.05,
        "actor.micro_batch_tokens": (2048 + 6144) * 2,
        "algorithm.overlong_buffer": 6144 // 3,
    },
    "grpo_array_knobs.sh": {"actor.engine": "fsdp2", "rollout.tensor_parallel_size": 2, "actor.use_kl_loss": True},
    "rloo_functions.sh": {"actor.micro_batch_size": 32 * 4 // 8},
    "reinforce_pp_heredocs.sh": {"reward.function": "./reinforce_pp/reward.py:compute_score"},
    "gmpo_continuations.sh": {"actor.clip_ratio_low": 0.4, "actor.loss_agg_mode": "seq-mean-token-mean"},
    "ppo_megatron_critic.sh": {"critic.lr": 1e-5, "algorithm.lam": 0.95},
    "gspo_model_engine.sh": {"actor.clip_ratio_low": 3e-4, "actor.clip_ratio_high": 4e-4},
    "cispo_fsdp.sh": {"actor.clip_ratio_low": 10, "actor.clip_ratio_high": 0.2, "actor.engine": "fsdp1"},
    "dapo_dynamic_sampling.sh": {
        "algorithm.dynamic_sampling": True,
        "algorithm.dynamic_sampling_metric": "acc",
        "algorithm.max_sample_rounds": 10,
        "algorithm.overlong_buffer": 4096 // 4,
        "algorithm.overlong_penalty": 1.0,
        "actor.clip_ratio_high": 0.28,
    },
    "rloo_rollout_correction.sh": {"algorithm.rollout_is": "sequence", "algorithm.rollout_is_cap": 2.0},
    "lora_token_budget.sh": {"actor.micro_batch_tokens": (512 + 1024) * 6},
    "remax_parameter_forms.sh": {"trainer.logger": ["console", "wandb"], "data.train_files": "gsm8k/train.parquet"},
}
SHAPES: dict[
    str, dict[str, object]
] = {  # script: verl settings that show one shell construct read as bash reads it (bash's values)
    "grpo_array_knobs.sh": {  # a case on a knob's default; `((world_size > 8))` false; TRAINER+=(...)
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
        "trainer.val_before_train": False,
        "actor_rollout_ref.actor.fsdp_config.fsdp_size": None,
    },
    "rloo_functions.sh": {  # functions with locals: the local is gone after the call, the global set
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
        "trainer.experiment_name": "rloo_no_size",
    },
    "reinforce_pp_heredocs.sh": {"data.train_batch_size": 512},  # not the here-document's verl line
    "gmpo_continuations.sh": {  # backslash-newline inside double quotes, arithmetic, an array
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "trainer.experiment_name": "gmpo_qwen3_1.7b",
        "actor_rollout_ref.actor.clip_ratio_high": 0.4,
        "trainer.balance_batch": "no",  # Hydra's string, not YAML 1.1's false
    },
    "ppo_megatron_critic.sh": {  # megatron strategy keys, `[[ a && b ]]`, a hydra +key
        "actor_rollout_ref.actor.strategy": "megatron",
        "critic.strategy": "megatron",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 2,
        "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size": 2,
        "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity": "full",
        "trainer.nnodes": 2,
    },
    "gspo_model_engine.sh": {"model_engine": "megatron", "trainer.nnodes": 2},  # loops before it not read
    "cispo_fsdp.sh": {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8},  # [[ =~ && != ]]
    "dapo_dynamic_sampling.sh": {"data.gen_batch_size": 256 * 3 // 2},  # `: "${TRAIN_PROMPTS:=256}"`
    "lora_token_budget.sh": {"actor_rollout_ref.model.lora_alpha": 64},
    "remax_parameter_forms.sh": {  # ${P##*/}, ${X,,}, ${X%%/*}, ${#ARR[@]}, declare, readonly
        "trainer.experiment_name": "remax-qwen3-4b-2loggers",
        "trainer.project_name": "gsm8k",
        "actor_rollout_ref.model.path": "Qwen/Qwen3-4B",
    },
}


def test_the_scripts_are_ours_and_each_is_expected_to_convert_or_be_refused():
    assert "not copies" in (ROOT / "README.md").read_text()
    assert len(SCRIPTS) == 15 and set(TABLE) | set(REFUSED) == set(SCRIPTS) and not set(TABLE) & set(REFUSED)
    assert set(OURS) | set(SHAPES) <= set(TABLE)
    assert all("-m verl.trainer.main_ppo" in (ROOT / s).read_text() for s in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_converts_with_every_variable_read_or_is_refused_in_one_line(script):
    text = (ROOT / script).read_text()
    if script in REFUSED:
        with pytest.raises(ValueError) as e:
            convert(*read(text))
        assert REFUSED[script] in str(e.value) and "\n" not in str(e.value), str(e.value)
        return
    overrides, unread, _ = read_script(text)
    conversion = convert(*read(text))
    left = {key for key, _, _ in conversion.left}
    assert {alias(key) for key in unread} <= left  # a value that needs the shell is named, with why
    for key, value in overrides.items():  # every value the shell gives is read to its end
        assert not UNEXPANDED.search(str(value)), (key, value)
    assert not UNEXPANDED.search(yaml.safe_dump(conversion.config)), conversion.config


@pytest.mark.parametrize("script", list(TABLE))
def test_representative_scripts_set_what_the_shell_gives(script, tmp_path):
    command, loss, n, mini, batch, prompt, response, lr = TABLE[script]
    overrides, _, _ = read_script((ROOT / script).read_text())
    expected: dict[str, object] = {**dict(zip(VERL, TABLE[script][1:])), **SHAPES.get(script, {})}
    for key, want in expected.items():
        assert overrides.get(key) == want, (key, overrides.get(key), want)
    out = tmp_path / "meshrl.yaml"
    assert main(["config", "from-verl", str(ROOT / script), "--out", str(out)]) == 0
    text = out.read_text()
    cfg = load_config(str(out))  # what it wrote is a config of ours
    assert f"run it with: meshrl {command} --config" in text
    assert cfg.actor.policy_loss == LOSSES[loss or "vanilla"]
    assert cfg.rollout.n == (n or 1)  # verl's default where the script sets none
    assert cfg.actor.mini_batch_size == mini * (n or 1)  # verl's prompts x rollout.n, in rows
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (batch, prompt)
    assert (cfg.rollout.max_new_tokens, cfg.actor.lr) == (response, lr)
    for key, ours in OURS.get(script, {}).items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == ours, key


def test_the_sapo_shape_of_issue_58_reads_its_unquoted_variables():
    """verl's SAPO example kept its settings in strings expanded unquoted ($ACTOR_CONFIG ...), one of them
    chosen under `if [[ $backend == "megatron" ]]`; read as one word each, it came out PPO-clip with n=1 and
    verl's 1024 prompts (issue 58). sapo_unquoted_configs.sh has that shape: read as bash splits it."""
    text = (ROOT / "sapo_unquoted_configs.sh").read_text()
    overrides, unread, assumed = read_script(text)
    assert overrides["actor_rollout_ref.actor.policy_loss.loss_mode"] == "sapo"
    assert overrides["actor_rollout_ref.actor.fsdp_config.strategy"] == "fsdp"  # the fsdp branch's
    assert overrides["actor_rollout_ref.ref.fsdp_config.strategy"] == "fsdp"  # ${FSDP_CONFIG//actor/ref}
    assert not any(".megatron." in key for key in overrides)  # the megatron branch is not taken
    assert overrides["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == (2048 + 6144) * 2
    assert overrides["reward.reward_kwargs.overlong_buffer_cfg.len"] == 2048
    assert unread["data.train_files"][1] == "needs the shell ($PWD, the environment's: the script does not set it)"
    assert unread["trainer.nnodes"][0] == "${SLURM_JOB_NUM_NODES}"
    assert assumed[0] == "its own defaults, as if the environment set none of: DATA_ROOT, PYTHONPATH"
    assert '`eval "$(conda shell.bash hook)"` (line 69) is taken to set none' in assumed[1]
    c = convert(overrides, unread, assumed)
    assert c.config["algorithm"]["overlong_buffer"] == 2048 and c.config["actor"]["micro_batch_tokens"] == 16384


def test_what_the_reading_took_is_said():
    """A file test guarding `source` is not known: the sourced file is taken to set none of the script's
    variables, and the output says so."""
    _, _, assumed = read_script((ROOT / "lora_token_budget.sh").read_text())
    assert assumed[0] == "`source ./site.env` (line 7) is taken to set none of the script's variables"
