"""Run config: YAML sections, dotted overrides, errors that name the key, a saved copy that reloads."""

import pytest

from orchestrator.config import load_config, save_config


def test_defaults_yaml_and_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("actor:\n  lr: 1.0e-4\n  model: models/x\nrollout:\n  n: 2\n")
    cfg = load_config(
        str(f),
        [
            "actor.lr=1e-5",
            "rollout.n=8",
            "reward.function=r.py:f",
            "trainer.run_dir=runs/a",
            "algorithm.norm_adv_by_std=false",
            "data.train_files=123",
        ],
    )
    assert cfg.actor.lr == 1e-5 and cfg.actor.model == "models/x" and cfg.rollout.n == 8
    assert cfg.reward.function == "r.py:f" and cfg.algorithm.norm_adv_by_std is False
    assert cfg.data.train_files == "123" and cfg.critic.clip_range_value == 0.5  # untouched default


def test_yaml_reads_numbers_as_users_write_them(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-5 as a string; verl users write it in every config."""
    f = tmp_path / "run.yaml"
    f.write_text("actor:\n  lr: 1e-5\n  weight_decay: 1E2\n  min_lr_ratio: .5\ncritic:\n  lr: +3e-6\n")
    cfg = load_config(str(f), ["rollout.temperature=7e-1"])
    assert (cfg.actor.lr, cfg.actor.weight_decay, cfg.actor.min_lr_ratio) == (1e-5, 100.0, 0.5)
    assert cfg.critic.lr == 3e-6 and cfg.rollout.temperature == 0.7
    assert load_config(None, ["actor.model=1e5"]).actor.model == "1e5"  # a str field keeps the text


@pytest.mark.parametrize(
    "text,overrides,match",
    [
        ("actr:\n  lr: 1\n", [], r"unknown config section\(s\) \['actr'\]"),
        ("actor:\n  learning_rate: 1\n", [], r"actor: unknown key\(s\) \['learning_rate'\]"),
        ("rollout:\n  n: four\n", [], r"rollout.n: expected int, got str"),
        ("", ["actor.lr"], "must look like section.key=value"),
        ("", ["actor.lrr=1"], r"unknown key actor.lrr"),
        ("", ["trainer.total_steps=1.5"], r"trainer.total_steps: expected int, got float"),
        ("", ["data.shuffle=maybe"], r"data.shuffle: expected bool"),
        ("", ["actor.lr_schedule=cosin"], r"actor.lr_schedule=cosin must be one of \('constant', 'cosine'\)"),
    ],
)
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


def parsed(cls, args: list[str], skip=()):
    """What a service's own flags (meshrl.flags, as `meshrl serve` adds them) read from `args`."""
    import argparse

    from meshrl.flags import add_dataclass_flags, dataclass_from_args

    p = argparse.ArgumentParser()
    add_dataclass_flags(p, cls, skip)
    return dataclass_from_args(cls, p.parse_known_args(args)[0], skip)


def test_the_services_read_back_every_setting_the_run_config_shares_with_them():
    """orchestrator/lifecycle/mesh.py::serve_args writes the actor's and rollout's flags from their config classes:
    a setting changed in the run config arrives (bools both ways), and nothing is kept by hand."""
    from meshrl.config.actor import EngineConfig, OptimConfig
    from meshrl.config.rollout import RolloutConfig
    from orchestrator.lifecycle.roles import serve_args

    changed = [
        "actor.mixed_precision=true",
        "actor.gradient_checkpointing=true",
        "actor.hsdp_replicate=2",
        "actor.share_prompts=false",
        "actor.weight_decay=0.1",
        "actor.micro_batch_tokens=512",
        "actor.engine=fsdp2",
        "actor.world_size=2",
        "actor.lr=3e-6",
        "rollout.dtype=bfloat16",
        "rollout.tensor_parallel_size=2",
        "rollout.gpu_memory_utilization=0.5",
        "rollout.enforce_eager=false",
        "rollout.backend=hf",
        "rollout.max_model_len=1024",
        "trainer.seed=7",
        "actor.lr_schedule=cosine",
        "actor.warmup_steps=3",
        "actor.min_lr_ratio=0.1",
        "trainer.total_steps=40",
    ]
    cfg = load_config(None, ["actor.model=m", "data.train_files=t", *changed])
    engine = parsed(EngineConfig, serve_args(cfg, "actor"))
    assert (
        engine.mixed_precision,
        engine.gradient_checkpointing,
        engine.hsdp_replicate,
        engine.share_prompts,
        engine.micro_batch_tokens,
        engine.engine,
        engine.seed,
    ) == (True, True, 2, False, 512, "fsdp2", 7)
    optim = parsed(OptimConfig, serve_args(cfg, "actor"), skip=("betas",))
    assert (optim.lr, optim.weight_decay) == (3e-6, 0.1)
    assert (optim.lr_schedule, optim.warmup_steps, optim.min_lr_ratio, optim.total_steps) == ("cosine", 3, 0.1, 40)
    assert "--lr" not in serve_args(cfg, "ref")  # a frozen model has no optimizer
    rollout = parsed(RolloutConfig, serve_args(cfg, "rollout"))
    assert (
        rollout.model,
        rollout.dtype,
        rollout.tensor_parallel_size,
        rollout.gpu_memory_utilization,
        rollout.enforce_eager,
        rollout.backend,
        rollout.max_model_len,
        rollout.seed,
    ) == ("m", "bfloat16", 2, 0.5, False, "hf", 1024, 7)
    defaults = parsed(EngineConfig, serve_args(load_config(None, ["actor.model=m", "data.train_files=t"]), "actor"))
    assert defaults.share_prompts and not defaults.mixed_precision
