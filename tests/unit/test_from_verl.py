"""`meshrl config from-verl`: a verl GRPO/PPO YAML or launch script becomes the config of the run verl would
make of it (its defaults, its batch arithmetic); what has no equivalent is named."""

import pathlib

import pytest
import yaml

from cli.main import main
from orchestrator.config import load_config
from orchestrator.from_verl import convert, read, render
from orchestrator.verl_script import read_script
from services.actor.batches import num_minibatches

DATA = pathlib.Path(__file__).parent / "data"
VERL = DATA / "verl_grpo.yaml"
LAUNCH = DATA / "verl_launch" / "test_from_verl"  # launch scripts written for these tests


def converted(raw: dict):
    return convert(*read(yaml.safe_dump(raw)))


def why(conversion) -> dict[str, str]:
    return {key: reason for key, _, reason in conversion.left}


def optimizer_steps(cfg) -> int:
    """Optimizer steps a batch takes here: ppo_epochs passes over its rows in mini-batches."""
    rows = cfg.data.train_batch_size * cfg.rollout.n
    return cfg.actor.ppo_epochs * num_minibatches(rows, cfg.actor.mini_batch_size)


def test_a_verl_grpo_config_maps_key_by_key_and_loads_as_ours(tmp_path):
    out = tmp_path / "meshrl.yaml"
    assert main(["config", "from-verl", str(VERL), "--out", str(out)]) == 0
    text = out.read_text()
    assert "run it with: meshrl grpo --config" in text
    cfg = load_config(str(out))  # what it wrote is a config of ours
    assert cfg.actor.lr == 1e-6 and cfg.actor.clip_ratio_low == cfg.actor.clip_ratio_high == 0.2
    assert cfg.actor.engine == "fsdp1" and cfg.actor.kl_loss_type == "k3"  # verl's fsdp, low_var_kl
    assert cfg.rollout.max_new_tokens == 1024  # through ${data.max_response_length}
    assert cfg.rollout.max_model_len == 512 + 1024 and cfg.rollout.n == 5
    assert cfg.data.train_files == "~/data/gsm8k/train.parquet"  # verl's one-file list
    assert cfg.algorithm.dynamic_sampling and cfg.algorithm.max_sample_rounds == 10
    assert cfg.algorithm.overlong_buffer == 256 and cfg.algorithm.overlong_penalty == 0.5  # DAPO's
    assert cfg.reward.function == "my_reward.py:compute_score" and cfg.trainer.resume
    assert "trainer.total_epochs: 15: set trainer.total_steps" in text
    assert "trainer.nnodes: 1: verl's placement" in text
    assert "#   actor_rollout_ref.actor.optim.weight_decay: 0.01" in text  # a default carried, said so


def test_a_mini_batch_counts_prompts_times_rollout_n_as_verl_does():
    # verl multiplies ppo_mini_batch_size by rollout.n before splitting a batch (ray_trainer.py, formerly
    # fsdp_workers.py `ppo_mini_batch_size *= rollout.n`): run_qwen2-7b's 1024 x 5 in 256 x 5 = 4 steps
    c = converted(
        {
            "data": {"train_batch_size": 1024},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 256}, "rollout": {"n": 5}},
            "algorithm": {"adv_estimator": "grpo"},
        }
    )
    assert c.config["actor"]["mini_batch_size"] == 1280  # rows: 256 prompts x 5 samples
    cfg = load_config(None, [f"{s}.{k}={v}" for s, keys in c.config.items() for k, v in keys.items()])
    assert optimizer_steps(cfg) == 4  # not 5120 / 256 = 20
    assert any("256 prompts x rollout.n 5" in line for line in c.derived)
    script = (
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.n=$N actor_rollout_ref.actor.ppo_mini_batch_size=8"
    )
    with pytest.raises(ValueError, match=r"rollout.n=\$N needs the shell \(\$N, the environment's"):
        convert(*read(script))  # n unknown here: neither it nor the mini-batch is guessed


def test_verls_defaults_stand_in_for_the_keys_a_file_does_not_set():
    c = converted({"algorithm": {"adv_estimator": "grpo"}, "actor_rollout_ref": {"actor": {"optim": {"lr": 3e-6}}}})
    assert c.config["rollout"]["n"] == 1  # verl's default, not our 4
    assert c.config["actor"]["lr"] == 3e-6  # the file's own value wins
    assert c.config["actor"]["mini_batch_size"] == 256 and c.config["data"]["train_batch_size"] == 1024
    assert c.config["rollout"]["max_new_tokens"] == 512 and c.config["rollout"]["max_model_len"] == 1024
    assert c.config["actor"]["weight_decay"] == 0.01 and c.config["actor"]["warmup_steps"] == 0
    assert c.config["trainer"]["save_every"] == 0 and c.config["trainer"]["val_every"] == 0  # verl's -1: never
    assert ("actor_rollout_ref.rollout.n", 1) in c.defaults and "critic" not in c.config  # no critic for grpo
    assert "set trainer.total_steps" in why(c)["trainer.total_epochs"]  # verl's 30 epochs cannot be carried
    assert converted({"algorithm": {"adv_estimator": "gae"}}).config["critic"] == {"lr": 1e-5, "clip_range_value": 0.5}


def test_one_bad_key_leaves_out_only_itself_with_its_own_reason():
    c = converted(
        {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {"max_prompt_length": 1024, "max_response_length": 2048},
            "actor_rollout_ref": {"rollout": {"temperature": -1}},
            "trainer": {"save_freq": -1, "total_training_steps": 0},  # -1: verl's "never"; 0: ours refuses it
        }
    )
    assert c.config["trainer"]["save_every"] == 0  # no periodic saves, not an error
    assert c.config["rollout"]["max_new_tokens"] == 2048 and c.config["rollout"]["max_model_len"] == 3072
    assert c.config["data"]["max_prompt_length"] == 1024 and c.config["rollout"]["n"] == 1
    reasons = why(c)
    assert set(reasons) == {"actor_rollout_ref.rollout.temperature", "trainer.total_training_steps"}
    assert reasons["trainer.total_training_steps"].startswith("trainer.total_steps: ")
    assert "rollout.temperature=-1.0 must be >= 0" in reasons["actor_rollout_ref.rollout.temperature"]
    clash = converted({"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "gspo"}}}})  # gspo + token-mean
    # the loss the file names is kept; verl's default aggregation, which GSPO's objective fixes, is left out
    assert clash.config["actor"]["policy_loss"] == "gspo" and "loss_agg_mode" not in clash.config["actor"]
    assert "must be seq-mean-token-mean" in why(clash)["actor_rollout_ref.actor.loss_agg_mode"]


def test_values_verl_reads_its_own_way_are_translated():
    c = converted(
        {
            "algorithm": {"adv_estimator": "grpo", "filter_groups": {"enable": True, "metric": "seq_reward"}},
            "trainer": {"logger": "console"},
        }
    )
    assert c.config["algorithm"]["dynamic_sampling_metric"] == "score"  # DAPO's seq_reward: the score
    assert c.config["trainer"]["logger"] == ["console"]  # a string, as verl takes it
    c = converted(
        {
            "trainer": {"logger": ["console", "swanlab"], "total_training_steps": 100},
            "actor_rollout_ref": {
                "actor": {
                    "clip_ratio": 0.3,
                    "clip_ratio_high": None,  # verl takes clip_ratio where a side is null
                    "ppo_max_token_len_per_gpu": 4096,  # without use_dynamic_bsz verl ignores it
                    "optim": {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.1},
                }
            },
        }
    )
    assert c.config["trainer"]["logger"] == ["console"] and "no logger here" in why(c)["trainer.logger"]
    assert c.config["actor"]["clip_ratio_low"] == 0.2 and c.config["actor"]["clip_ratio_high"] == 0.3
    assert "micro_batch_tokens" not in c.config["actor"]
    assert "use_dynamic_bsz" in why(c)["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]
    assert c.config["actor"]["warmup_steps"] == 10  # verl's ratio x its steps
    ignored = converted({"actor_rollout_ref": {"actor": {"clip_ratio": 0.3}}})  # verl's low/high default 0.2
    assert ignored.config["actor"]["clip_ratio_high"] == 0.2
    assert "clip_ratio_low and clip_ratio_high" in why(ignored)["actor_rollout_ref.actor.clip_ratio"]


def test_what_ours_refuses_or_lacks_is_listed_not_dropped():
    raw = {
        "algorithm": {"adv_estimator": "gae", "gamma": 0.99, "kl_penalty": "full"},
        "actor_rollout_ref": {
            "rollout": {"name": "sglang", "temperature": -1},
            "actor": {"ppo_epochs": 2},
            "model": {"use_remove_padding": False},
        },
        "data": {"train_files": ["a.parquet", "b.parquet"], "max_response_length": "${data.nothing}"},
        "critic": {"optim": {"lr": 2e-5}},
        "reward_model": {"overlong_buffer": {"enable": False, "len": 64}},
    }
    c = converted(raw)
    assert c.command == "ppo"  # gae: the critic's algorithm
    assert c.config["algorithm"]["gamma"] == 0.99 and c.config["critic"]["lr"] == 2e-5
    assert c.config["actor"]["ppo_epochs"] == 2 and c.config["actor"]["padding_free"] is False
    assert "max_new_tokens" not in c.config["rollout"]  # its reference is unresolved: no default either
    reasons = why(c)
    assert "ours: k1, k2, k3, abs" in reasons["algorithm.kl_penalty"]
    assert "ours: vllm, hf" in reasons["actor_rollout_ref.rollout.name"]
    assert "rollout.temperature" in reasons["actor_rollout_ref.rollout.temperature"]  # ours refused the value
    assert "names one data file" in reasons["data.train_files"]
    assert "not resolved" in reasons["data.max_response_length"]
    assert "off in this file" in reasons["reward_model.overlong_buffer.len"]
    assert "reward_model.overlong_buffer.enable" not in reasons  # it took effect through the length
    assert converted({"algorithm": {"adv_estimator": "remax"}}).left[0][2].startswith("no command here")


SCRIPTS = {  # launch scripts in the shapes of verl's examples (LAUNCH, tests/unit/data/verl_launch/README.md)
    "grpo_gsm8k_hub_model.sh": dict(n=5, steps=4, lr=1e-6, prompt=512, response=1024, model="Qwen/Qwen2.5-7B-Instruct"),
    "dapo_recipe_dynamic_sampling.sh": dict(n=16, steps=16, lr=1e-6, prompt=2048, response=20480, model=None),
    "dapo_7b_reward_kwargs.sh": dict(n=16, steps=16, lr=1e-6, prompt=2048, response=8192, model=None),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_verls_example_scripts_convert_to_what_verl_runs(name, tmp_path):
    want = SCRIPTS[name]
    out = tmp_path / "meshrl.yaml"
    assert main(["config", "from-verl", str(LAUNCH / name), "--out", str(out)]) == 0
    cfg = load_config(str(out))
    assert cfg.rollout.n == want["n"] and optimizer_steps(cfg) == want["steps"] and cfg.actor.lr == want["lr"]
    assert cfg.data.max_prompt_length == want["prompt"] and cfg.rollout.max_new_tokens == want["response"]
    assert cfg.rollout.max_model_len == want["prompt"] + want["response"]
    text = out.read_text()
    if want["model"]:
        assert cfg.actor.model == want["model"]
        assert "data.train_files: '$HOME/data/gsm8k/train.parquet': needs the shell ($HOME" in text
    else:  # DAPO: the model path is under the environment's $HOME, said; its recipe's settings carried
        assert cfg.actor.model == "" and "actor_rollout_ref.model.path: '${HOME}/verl/models/Qwen2.5" in text
        assert "as if the environment set none of: " in text and "RAY_DATA_HOME, MODEL_PATH, CKPTS_DIR" in text
        assert cfg.actor.clip_ratio_high == 0.28 and cfg.actor.warmup_steps == 10 and cfg.actor.weight_decay == 0.1
        assert cfg.algorithm.overlong_buffer == 4096 and cfg.algorithm.overlong_penalty == 1.0
        assert cfg.actor.micro_batch_tokens == (2048 + want["response"]) * (2 if "7b" in name else 1)
    if name == "dapo_recipe_dynamic_sampling.sh":  # recipe.dapo.main_dapo, with dynamic sampling
        assert cfg.algorithm.dynamic_sampling and cfg.algorithm.dynamic_sampling_metric == "acc"
        assert cfg.algorithm.max_sample_rounds == 10 and "data.gen_batch_size: 1536" in text


def test_a_script_is_read_as_the_shell_reads_it():
    script = """#!/usr/bin/env bash
set -x
export VLLM_ATTENTION_BACKEND=XFORMERS
n=8  # samples
len=$((1024 * 2))
both=$(((len + 512) * 2))
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B}
if true; then
    lr=5
fi
python3 -m verl.trainer.main_ppo \\
    actor_rollout_ref.rollout.n=${n} \\
    data.max_prompt_length=$len \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$both" \\
    trainer.logger='["console","wandb"]' \\
    +actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.model.path="${MODEL}" \\
    actor_rollout_ref.actor.entropy_coeff=$lr \\
    data.train_files=$HOME/train.parquet \\
    data.prompt_key=question "$@" 2>&1 | tee log.txt
"""
    overrides, unread, assumed = read_script(script)
    assert overrides == {
        "actor_rollout_ref.rollout.n": 8,
        "data.max_prompt_length": 2048,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 5120,
        "trainer.logger": ["console", "wandb"],
        "actor_rollout_ref.actor.optim.lr": 1e-6,
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B",  # the script's default for what the environment sets
        "actor_rollout_ref.actor.entropy_coeff": 5,  # `if true` is taken
        "data.prompt_key": "question",
    }
    assert unread == {
        "data.train_files": (
            "$HOME/train.parquet",
            "needs the shell ($HOME, the environment's: the script does not set it)",
        )
    }
    assert assumed == [
        "its own defaults, as if the environment set none of: MODEL",
        "read as run with no arguments: $@, $1, ... are empty",
    ]
    c = convert(*read(script))
    assert c.config["rollout"]["n"] == 8 and c.config["actor"]["model"] == "Qwen/Qwen2.5-0.5B"
    assert "train_files" not in c.config["data"] and "as if the environment set none of: MODEL" in render(c, "x")
    with pytest.raises(ValueError, match="no verl command"):
        read_script("N=1\n# python3 -m verl.trainer.main_ppo a=1\n")


def test_a_raw_verl_file_given_to_config_points_to_from_verl(tmp_path):
    for path in (VERL, LAUNCH / "grpo_gsm8k_hub_model.sh"):
        with pytest.raises(ValueError) as e:
            load_config(str(path))
        assert f"convert it with `meshrl config from-verl {path} --out meshrl.yaml`" in str(e.value)
        assert "\n" not in str(e.value) and "unknown" not in str(e.value)
    ours = tmp_path / "ours.yaml"
    ours.write_text("# converted from verl.trainer.main_ppo (a comment)\nrollout:\n  n: 2\n")
    assert load_config(str(ours)).rollout.n == 2


def test_a_file_that_is_neither_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([1, 2]))
    assert main(["config", "from-verl", str(bad)]) == 2
    assert "not a YAML mapping" in capsys.readouterr().err
    assert main(["config", "from-verl", str(tmp_path / "missing.yaml")]) == 2


@pytest.mark.parametrize(
    "mode,extra,ours",
    [
        ("geo_mean", {}, {"policy_loss": "gmpo"}),
        ("cispo", {"clip_ratio_low": 10, "clip_ratio_high": 0.2}, {"policy_loss": "cispo", "clip_ratio_low": 10}),
        ("sapo", {"tau_pos": 1.5, "tau_neg": 2.0}, {"policy_loss": "sapo", "tau_pos": 1.5, "tau_neg": 2.0}),
        ("clip_cov", {"policy_loss": {"clip_cov_ratio": 0.002}}, {"policy_loss": "clip_cov", "clip_cov_ratio": 0.002}),
        ("kl_cov", {"policy_loss": {"kl_cov_ratio": 0.002, "ppo_kl_coef": 1}}, {"kl_cov_ratio": 0.002}),
    ],
)
def test_verls_policy_losses_and_their_settings_carry_over(mode, extra, ours):
    actor = {**extra, "policy_loss": {"loss_mode": mode, **extra.get("policy_loss", {})}}
    c = converted({"actor_rollout_ref": {"actor": actor}})
    assert ours.items() <= c.config["actor"].items()
    # verl's defaults that this loss does not read (sapo has no clip) or that its objective fixes (gmpo's
    # aggregation) are left out, each with the reason; the loss the file names stays
    reasons = [r for k, r in why(c).items() if k.startswith("actor_rollout_ref.actor.")]
    assert all("is read by policy_loss" in r or "its objective's own" in r for r in reasons), reasons


def test_verls_rollout_correction_carries_over():
    c = converted(
        {
            "algorithm": {
                "rollout_correction": {
                    "rollout_is": "sequence",
                    "rollout_is_threshold": "0.5_5.0",  # IcePop's band
                    "rollout_rs": "token_k1,seq_max_k3",
                    "rollout_rs_threshold": "2.0,0.01",
                }
            }
        }
    )
    assert {
        "rollout_is": "sequence",
        "rollout_is_cap": 5.0,
        "rollout_is_mode": "mask",
        "rollout_is_floor": 0.5,
        "rollout_rs": "token_k1,seq_max_k3",
        "rollout_rs_threshold": "2.0,0.01",
    }.items() <= c.config["algorithm"].items()
    tis = converted({"algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0}}})
    assert tis.config["algorithm"]["rollout_is_cap"] == 2.0 and "rollout_is_mode" not in tis.config["algorithm"]


def test_every_key_the_tables_name_is_one_of_ours():
    """The hint table's targets (verl's and OpenRLHF's keys) and the conversions' are keys of our config, so
    a renamed setting cannot leave a conversion pointing at nothing."""
    from orchestrator.from_verl import CONVERSIONS, KL_KEYS, OURS
    from orchestrator.verl_keys import VERL_KEYS

    targets = {target.split(" ")[0] for target in VERL_KEYS.values()} | set(KL_KEYS.values())
    assert not targets - OURS, sorted(targets - OURS)
    flat = {"actor_rollout_ref.actor.use_dynamic_bsz": True, "reward_model.overlong_buffer.enable": True}
    samples = {"actor_rollout_ref.actor.strategy": "fsdp", "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla"}
    samples |= {
        "trainer.logger": "console",
        "algorithm.filter_groups.metric": "acc",
        "actor_rollout_ref.rollout.name": "hf",
    }
    samples |= {key: "k3" for key in KL_KEYS}
    made = {k for key, convert in CONVERSIONS.items() for k in convert(samples.get(key, 1), flat)}
    assert not made - OURS, sorted(made - OURS)
