"""`meshrl config from-verl`: a verl GRPO/PPO YAML becomes our config; what has no equivalent is named."""

import yaml

from cli.main import main
from orchestrator.config import load_config
from orchestrator.from_verl import convert

VERL = __import__("pathlib").Path(__file__).parent / "data" / "verl_grpo.yaml"


def test_a_verl_grpo_config_maps_key_by_key_and_loads_as_ours(tmp_path, capsys):
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


def test_what_ours_refuses_or_lacks_is_listed_not_dropped():
    raw = {
        "algorithm": {"adv_estimator": "gae", "gamma": 0.99, "kl_penalty": "full"},
        "actor_rollout_ref": {
            "rollout": {"name": "sglang", "temperature": -1},
            "actor": {"ppo_epochs": 2},
            "model": {"use_remove_padding": False},
        },
        "data": {"train_files": ["a.parquet", "b.parquet"], "max_response_length": "${data.nothing}"},
        "critic": {"optim": {"lr": 1e-5}},
        "reward_model": {"overlong_buffer": {"enable": False, "len": 64}},
    }
    command, config, left = convert(raw)
    assert command == "ppo"  # gae: the critic's algorithm
    actor = {"ppo_epochs": 2, "padding_free": False}  # verl's use_remove_padding: false
    assert config == {"algorithm": {"gamma": 0.99}, "actor": actor, "critic": {"lr": 1e-5}}
    why = {key: reason for key, _, reason in left}
    assert "ours: k1, k2, k3, abs" in why["algorithm.kl_penalty"]
    assert "ours: vllm, hf" in why["actor_rollout_ref.rollout.name"]
    assert "rollout.temperature" in why["actor_rollout_ref.rollout.temperature"]  # ours refused the value
    assert "names one data file" in why["data.train_files"]
    assert "not resolved" in why["data.max_response_length"]
    assert "off in this file" in why["reward_model.overlong_buffer.len"]
    assert "reward_model.overlong_buffer.enable" not in why  # it took effect through the length
    assert convert({"algorithm": {"adv_estimator": "remax"}})[2][0][2].startswith("no command here")


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([1, 2]))
    assert main(["config", "from-verl", str(bad)]) == 2
    assert "not a YAML mapping" in capsys.readouterr().err
    assert main(["config", "from-verl", str(tmp_path / "missing.yaml")]) == 2
