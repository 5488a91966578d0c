"""`meshrl config from-verl` over every launch script of verl's examples/ (tests/unit/data/verl_examples/):
each converts, with every setting as the shell would give it, or is refused in one line naming what could
not be read; none converts with a shell variable silently dropped or left unexpanded. The expected values
below were taken from bash itself, running each script with stand-ins for python3/uv/srun that print the
verl command's arguments."""

import pathlib
import re

import pytest
import yaml

from cli.main import main
from orchestrator.config import load_config
from orchestrator.from_verl import LOSSES, alias, convert, read
from orchestrator.verl_script import read_script

ROOT = pathlib.Path(__file__).parent / "data" / "verl_examples"
SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.sh"))
DEVICE = "which depends on DEVICE (line"  # DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' ...)}: GPU or NPU
REFUSED = {  # script: what its one-line refusal names
    **{
        f"examples/grpo_trainer/{name}.sh": DEVICE
        for name in (
            "run_qwen2_5_32b_fsdp",
            "run_qwen2_5_vl_7b_fsdp",
            "run_qwen3_235b_a22b_megatron",
            "run_qwen3_30b_veomni",
            "run_qwen3_4b_fsdp",
            "run_qwen3_5_122b_a10b_megatron",
            "run_qwen3_5_27b_fsdp",
            "run_qwen3_5_27b_fsdp_turbo",
            "run_qwen3_5_35b_fsdp",
            "run_qwen3_5_35b_fsdp_turbo",
            "run_qwen3_5_35b_megatron",
            "run_qwen3_5_397b_megatron",
            "run_qwen3_8b_fsdp",
            "run_qwen3_next_80b_a3b_fsdp",
            "run_qwen3_vl_30b_a3b_fsdp",
            "run_qwen3_vl_8b_fsdp",
        )
    },
    "examples/gspo_trainer/run_qwen3_8b_fsdp.sh": DEVICE,
    "examples/ppo_trainer/run_qwen3_8b_fsdp.sh": DEVICE,
    # MODEL_PATH=${MODEL_PATH:-${KIMI_K2_6_MODEL_PATH:-}} then `: "${MODEL_PATH:?...}"`: the script stops
    "examples/grpo_trainer/run_kimi_k2_6_glm5_1_megatron_lite.sh": "line 65: the script stops without MODEL_PATH",
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
TABLE = {  # script: (our command, then VERL's values as bash gives them; None: the script does not set it)
    "examples/sapo_trainer/run_qwen30b_sapo.sh": ("grpo", "sapo", 16, 32, 256, 2048, 8192, 1e-6),
    "examples/sapo_trainer/run_qwen3_30b_a3b_fsdp.sh": ("grpo", "sapo", 16, 32, 256, 2048, 8192, 1e-6),
    "examples/sapo_trainer/run_qwen3_8b_fsdp.sh": ("grpo", "sapo", 16, 64, 256, 2048, 8192, 1e-6),
    "examples/grpo_trainer/run_qwen3_8b_megatron.sh": ("grpo", None, 5, 256, 1024, 1024, 2048, 1e-6),
    "examples/grpo_trainer/run_hy_v3_megatron.sh": ("grpo", None, 16, 128, 128, 2048, 8192, 1e-6),
    "examples/ppo_trainer/run_qwen3_8b_megatron.sh": ("ppo", None, 1, 256, 1024, 1024, 2048, 1e-6),
    "examples/rloo_trainer/run_qwen3_8b_fsdp.sh": ("rloo", None, 5, 256, 1024, 1024, 2048, 1e-6),
    "examples/reinforce_plus_plus_trainer/run_qwen3_8b_fsdp.sh": ("reinforce", None, 8, 1024, 1024, 1024, 2048, 3e-6),
    "examples/gspo_trainer/run_qwen3_30b_a3b_megatron.sh": ("grpo", "gspo", 16, 32, 256, 2048, 8192, 1e-6),
    "examples/cispo_trainer/run_qwen3_8b_fsdp.sh": ("grpo", "cispo", 5, 256, 1024, 1024, 2048, 1e-6),
    "examples/gmpo_trainer/run_qwen3_8b_fsdp.sh": ("grpo", "geo_mean", 5, 256, 1024, 1024, 2048, 1e-6),
    "examples/rollout_correction/run_qwen2_5_7b_fsdp.sh": ("rloo", None, None, 32, 128, 2048, 4096, 5e-7),
    "examples/tuning/lora/run_qwen3_8b_fsdp.sh": ("grpo", None, 5, 32, 64, 512, 1024, 3e-6),
    "examples/ascend_extras/grpo_trainer/run_qwen3_32b_fsdp.sh": ("grpo", None, 4, 64, 1024, 2048, 2048, 1e-6),
}
OURS = {  # further settings of ours a script gives, as converted
    "examples/sapo_trainer/run_qwen30b_sapo.sh": {"actor.tau_pos": 1.0, "actor.tau_neg": 1.05},
    "examples/gspo_trainer/run_qwen3_30b_a3b_megatron.sh": {
        "actor.clip_ratio_low": 3e-4,
        "actor.clip_ratio_high": 4e-4,
    },
    "examples/cispo_trainer/run_qwen3_8b_fsdp.sh": {"actor.clip_ratio_low": 10, "actor.clip_ratio_high": 0.2},
    "examples/rollout_correction/run_qwen2_5_7b_fsdp.sh": {"algorithm.rollout_is": "sequence"},
    "examples/tuning/lora/run_qwen3_8b_fsdp.sh": {"actor.micro_batch_tokens": 12288},
    "examples/grpo_trainer/run_hy_v3_megatron.sh": {"algorithm.rollout_is": "token", "actor.clip_ratio_high": 0.28},
}


def test_the_copies_are_verls_scripts_of_the_trainers_we_read():
    assert len(SCRIPTS) == 91 and set(TABLE) | set(REFUSED) <= set(SCRIPTS)
    assert all("verl.trainer.main_ppo" in (ROOT / s).read_text() for s in SCRIPTS)


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
    command, *verl = TABLE[script]
    overrides, _, _ = read_script((ROOT / script).read_text())
    for key, want in zip(VERL, verl):
        assert overrides.get(key) == want, (key, overrides.get(key), want)
    out = tmp_path / "meshrl.yaml"
    assert main(["config", "from-verl", str(ROOT / script), "--out", str(out)]) == 0
    text = out.read_text()
    cfg = load_config(str(out))  # what it wrote is a config of ours
    loss, n, mini, batch, prompt, response, lr = verl
    assert f"run it with: meshrl {command} --config" in text
    assert cfg.actor.policy_loss == LOSSES[loss or "vanilla"]
    assert cfg.rollout.n == (n or 1)  # verl's default where the script sets none
    assert cfg.actor.mini_batch_size == mini * (n or 1)  # verl's prompts x rollout.n, in rows
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (batch, prompt)
    assert (cfg.rollout.max_new_tokens, cfg.actor.lr) == (response, lr)
    for key, want in OURS.get(script, {}).items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == want, key


def test_the_sapo_example_of_issue_58_reads_its_unquoted_variables():
    """Its settings sit in strings expanded unquoted ($ACTOR_CONFIG ...), one of them chosen under
    `if [[ $backend == "megatron" ]]`: read as bash splits them, not PPO-clip with n=1 and 256 prompts."""
    text = (ROOT / "examples/sapo_trainer/run_qwen30b_sapo.sh").read_text()
    overrides, unread, assumed = read_script(text)
    assert overrides["actor_rollout_ref.actor.policy_loss.loss_mode"] == "sapo"
    assert overrides["actor_rollout_ref.actor.fsdp_config.strategy"] == "fsdp"  # the fsdp branch's
    assert not any(".megatron." in key for key in overrides)  # the megatron branch is not taken
    assert overrides["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == (2048 + 8192) * 3
    assert overrides["reward.reward_kwargs.overlong_buffer_cfg.len"] == 4096
    assert unread["data.train_files"][1] == "needs the shell ($PWD, the environment's: the script does not set it)"
    assert unread["trainer.nnodes"][0] == "${SLURM_JOB_NUM_NODES}"
    assert assumed[0] == "its own defaults, as if the environment set none of: DATA_ROOT"
    assert '`eval "$(conda shell.bash hook)"` (line 260) is taken to set none' in assumed[1]
    c = convert(overrides, unread, assumed)
    assert c.config["algorithm"]["overlong_buffer"] == 4096 and c.config["actor"]["micro_batch_tokens"] == 30720
