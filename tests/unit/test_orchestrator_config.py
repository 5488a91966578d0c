"""Run config: YAML sections, dotted overrides, errors that name the key, a saved copy that reloads."""

import pytest

from orchestrator.config import load_config, save_config


def test_defaults_yaml_and_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("actor:\n  lr: 1.0e-4\n  model: models/x\nrollout:\n  n: 2\n")
    cfg = load_config(str(f), ["actor.lr=1e-5", "rollout.n=8", "reward.function=r.py:f", "trainer.run_dir=runs/a",
                               "algorithm.norm_adv_by_std=false", "data.train_files=123"])
    assert cfg.actor.lr == 1e-5 and cfg.actor.model == "models/x" and cfg.rollout.n == 8
    assert cfg.reward.function == "r.py:f" and cfg.algorithm.norm_adv_by_std is False
    assert cfg.data.train_files == "123" and cfg.critic.clip_range_value == 0.5  # untouched default


@pytest.mark.parametrize("text,overrides,match", [
    ("actr:\n  lr: 1\n", [], r"unknown config section\(s\) \['actr'\]"),
    ("actor:\n  learning_rate: 1\n", [], r"actor: unknown key\(s\) \['learning_rate'\]"),
    ("rollout:\n  n: four\n", [], r"rollout.n: expected int, got str"),
    ("", ["actor.lr"], "must look like section.key=value"),
    ("", ["actor.lrr=1"], r"unknown key actor.lrr"),
    ("", ["trainer.total_steps=1.5"], r"trainer.total_steps: expected int, got float"),
    ("", ["data.shuffle=maybe"], r"data.shuffle: expected bool"),
])
def test_mistakes_name_the_key(tmp_path, text, overrides, match):
    f = tmp_path / "run.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_config(str(f), overrides)


def test_saved_config_reloads_the_same(tmp_path):
    cfg = load_config(None, ["actor.lr=3e-6", "rollout.temperature=0.7"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == cfg


def test_command_line_takes_a_config_and_overrides_in_any_order(tmp_path):
    from orchestrator.main import parse

    f = tmp_path / "run.yaml"
    f.write_text("rollout:\n  n: 2\n")
    algorithm, cfg = parse(["grpo", "actor.lr=2e-5", "--config", str(f), "rollout.n=3"])
    assert algorithm == "grpo" and cfg.actor.lr == 2e-5 and cfg.rollout.n == 3


def test_bundled_configs_load():
    import pathlib

    for f in sorted(pathlib.Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml")):
        load_config(str(f))


def test_list_fields_take_yaml_lists_and_check_items():
    cfg = load_config(None, ["ray.colocate=[rollout, ref]"])
    assert cfg.ray.colocate == ["rollout", "ref"]
    with pytest.raises(ValueError, match=r"ray.colocate\[0\]: expected str"):
        load_config(None, ["ray.colocate=[1]"])
    with pytest.raises(ValueError, match="ray.colocate: expected a list"):
        load_config(None, ["ray.colocate=rollout"])
