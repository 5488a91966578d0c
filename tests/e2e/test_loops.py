"""Every algorithm's loop for a few steps through the real mesh it starts (HF rollout, actor, ref and
critic services, reward service), with the char-level llama and with a Qwen2.5-shaped BPE model (ChatML
template, two end tokens): the update happened, the metrics are finite, the rollout's log-probs are the
actor's, the run leaves its report; and a run whose service dies mid-step fails clearly and resumes from
its checkpoint."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from orchestrator.config import load_config
from orchestrator.main import run
from orchestrator.run.trainer import StepFailed

# An untrained model scores 0 on the task, and equal scores teach nothing: vary them by length.
VARIED = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return float(len(solution_str) % 3)\n"
    "\n\n"
    "def some_vary(data_source, solution_str, ground_truth, extra_info=None):  # others score 0 whatever the answer\n"
    "    return float(len(solution_str) % 3) if '1' in str(ground_truth) else 0.0\n"
)


@pytest.fixture
def model(request, tiny_lm):
    """The char-level llama, or (a test parametrized with model="bpe") the BPE qwen2."""
    return request.getfixturevalue("bpe_lm") if getattr(request, "param", "char") == "bpe" else tiny_lm


@pytest.fixture
def base(model, arithmetic_data, tmp_path):
    reward = tmp_path / "varied_reward.py"
    reward.write_text(VARIED)
    return [
        f"actor.model={model}",
        f"data.train_files={arithmetic_data['train']}",
        f"data.val_files={arithmetic_data['test']}",
        "data.val_batch_size=32",
        "trainer.val_every=2",
        "data.train_batch_size=4",
        "rollout.n=4",
        "rollout.backend=hf",
        "actor.engine=plain",
        "reward.workers=1",
        "actor.lr=1e-3",
        f"reward.function={reward}:compute_score",
        f"trainer.run_dir={tmp_path / 'run'}",
        "trainer.total_steps=2",
    ]


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def changed(run_dir, model_dir) -> bool:
    after = load_file(run_dir / "hf" / "model.safetensors")
    before = load_file(model_dir / "model.safetensors")
    return any(not torch.equal(after[k], before[k]) for k in before)


LOSSES = {  # (algorithm, model) -> the policy loss it trains with here, with the paper's defaults
    ("ppo", "char"): "clip_cov",
    ("ppo", "bpe"): "kl_cov",
    ("rloo", "char"): "gspo",
    ("rloo", "bpe"): "gmpo",
    ("reinforce", "char"): "cispo",
    ("reinforce", "bpe"): "sapo",
}
LOSS_METRICS = {
    "gspo": "actor/seq_ratio_mean",
    "clip_cov": "actor/clip_cov_frac",
    "kl_cov": "actor/kl_cov_frac",
    "cispo": "actor/pg_clipfrac",
    "sapo": "actor/pg_gate_mean",
    "gmpo": "actor/pg_clipfrac_lower",
}


@pytest.mark.parametrize(
    "algorithm, extra, expected",
    [
        ("ppo", ["critic.lr=1e-3", "algorithm.lam=0.95"], {"critic/vf_loss", "actor/pg_loss", "timing_s/values"}),
        (
            "rloo",
            # two Generate calls a step, each scored as it returns; a ratio per sequence as the loss (LOSSES),
            [
                "rollout.chunks=2",
                "algorithm.overlong_buffer=8",  # and DAPO's overlong penalty on the scores
                "algorithm.dynamic_sampling=true",  # and DAPO's dynamic sampling (groups that vary, more rounds)
                "algorithm.dynamic_sampling_metric=score",
                "reward.function=VARIED:some_vary",  # groups of problems without a 1 in the answer never vary
                "algorithm.max_sample_rounds=3",
            ],
            {
                "actor/pg_loss",
                "actor/pg_clipfrac",
                "actor/ppo_kl",
                "critic/overlong_penalty/mean",
                "critic/overlong_penalty/share",
                "dynamic_sampling/rounds",
                "dynamic_sampling/kept_groups",
                "dynamic_sampling/samples_per_kept",
            },
        ),
        (
            "reinforce",
            [
                "algorithm.use_kl_in_reward=true",
                "algorithm.kl_ctrl=adaptive",
                "algorithm.kl_coef=0.1",
                "algorithm.kl_target=0.001",
                "algorithm.kl_horizon=10",
            ],
            {"actor/pg_loss", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "timing_s/ref"},
        ),
        ("dpo", [], {"actor/dpo_loss", "actor/num_pairs"}),
    ],
)
@pytest.mark.parametrize("model", ["char", "bpe"], indirect=True)
def test_each_algorithm_trains_through_the_mesh(algorithm, extra, expected, base, model, request):
    varied = next(k.split("=", 1)[1].split(":")[0] for k in base if k.startswith("reward.function="))
    loss = LOSSES.get((algorithm, request.node.callspec.params["model"]))
    if loss:  # every policy loss of the table through a whole loop, with its own defaults and metric
        extra, expected = [*extra, f"actor.policy_loss={loss}"], {*expected, LOSS_METRICS[loss]}
    run_dir = run(algorithm, load_config(None, [*base, *(e.replace("VARIED", varied) for e in extra)]))
    logged = rows(run_dir)
    assert [r["step"] for r in logged] == [0, 1, 2]  # step 0: validation before training
    for r in logged[1:]:  # never more groups than the batch, never more rounds than allowed
        assert r.get("dynamic_sampling/kept_groups", 0) <= 4 and r.get("dynamic_sampling/rounds", 1) <= 3
    if "dynamic_sampling/rounds" in expected:  # some groups never vary: dropped, and more rounds sampled
        assert sum(r["dynamic_sampling/dropped_groups"] for r in logged[1:]) > 0
        assert max(r["dynamic_sampling/rounds"] for r in logged[1:]) > 1
    assert "val/score/mean" in logged[0] and "val/score/mean" in logged[2]
    for r in logged[1:]:
        assert expected <= set(r), expected - set(r)
        assert all(math.isfinite(v) for v in r.values())
    assert changed(run_dir, model)
    parity = [r["rollout/kl_to_actor"] for r in logged[1:] if "rollout/kl_to_actor" in r]
    assert all(kl < 1e-3 for kl in parity), parity  # the rollout samples from the actor's weights
    assert parity or algorithm == "dpo"
    assert (run_dir / "curves.png").stat().st_size > 1000 and "critic/score/mean" in (
        run_dir / "summary.md"
    ).read_text()
    assert list((run_dir / "tensorboard").iterdir())
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4  # trainer.samples_per_step=4
    assert {"prompt", "response", "score", "ground_truth", "reward_status"} <= set(samples[0])
    assert logged[1]["reward/num_failed"] == 0
    if algorithm == "reinforce":  # the adaptive controller moved the coefficient off its start
        assert logged[2]["actor/reward_kl_penalty_coeff"] != 0.1


def test_validation_reports_mean_and_best_at_k(base):
    """... in a run that saves nothing (trainer.save_every=0, save_final=false: a quick experiment)."""
    run_dir = run(
        "grpo",
        load_config(
            None,
            [
                *base,
                "trainer.total_steps=1",
                "trainer.val_k=3",
                "reward.function=",
                "trainer.save_every=0",
                "trainer.save_final=false",
            ],
        ),
    )
    first = rows(run_dir)[0]  # the built-in arithmetic scorer: acc too
    assert 0 <= first["val/acc/mean@3"] <= first["val/acc/best@3"] <= 1 and "val/acc/mean" in first
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "hf").exists()


def test_a_reward_model_started_by_the_run_scores_the_samples(base, tiny_rm):
    """reward.model reaches the reward service the run starts (it was a service flag no run could set)."""
    run_dir = run(
        "grpo",
        load_config(
            None, [*base, "trainer.total_steps=1", "reward.function=", f"reward.model={tiny_rm}", "reward.batch_size=8"]
        ),
    )
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(math.isfinite(s["score"]) for s in samples)
    assert any(s["score"] not in (0.0, 1.0) for s in samples)  # a model's score, not a rule's
    assert rows(run_dir)[1]["critic/score/mean"] != 0


def test_failed_rewards_are_counted_and_every_logger_gets_the_run(base, tmp_path, monkeypatch, caplog):
    """reward.on_error=score: failures score 0 but show in metrics, the log and the samples; val_every=0
    validates only before the first and after the last step; W&B and MLflow run offline in the run folder."""
    for var in ("WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    flaky = tmp_path / "flaky_reward.py"
    flaky.write_text(
        "def compute_score(solution_str, ground_truth, **kwargs):\n"
        "    if len(solution_str) % 2:\n        raise ValueError('odd length')\n    return 1.0\n"
    )
    run_dir = run(
        "grpo",
        load_config(
            None,
            [
                *base,
                f"reward.function={flaky}:compute_score",
                "reward.on_error=score",
                "trainer.val_every=0",
                "trainer.total_steps=3",
                "trainer.logger=[console,tensorboard,wandb,mlflow]",
            ],
        ),
    )
    logged = rows(run_dir)
    assert [r["step"] for r in logged] == [0, 1, 2, 3]
    assert "val/score/mean" in logged[0] and "val/score/mean" not in logged[1] and "val/score/mean" in logged[3]
    failed = [r["reward/num_failed"] for r in logged[1:]]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    odd = [s for s in samples if len(s["response"]) % 2]
    assert odd and all(
        s["reward_status"] == "error" and "odd length" in s["reward_error"] and s["score"] == 0 for s in odd
    )
    assert sum(failed) > 0 and "samples failed to score" in caplog.text
    assert list((run_dir / "wandb").glob("offline-run-*")) and list((run_dir / "mlruns").rglob("critic/score/mean"))


def test_a_service_dying_mid_step_fails_clearly_and_the_run_resumes(base, tmp_path):
    dying = tmp_path / "dying_reward.py"  # kills the reward service (its parent) at the third step's scoring
    dying.write_text(
        "import os, signal\n"
        + VARIED.replace(
            "    return",
            "    if extra_info and os.path.exists("
            f"{str(tmp_path / 'armed')!r}"
            "):\n        os.kill(os.getppid(), signal.SIGKILL)\n    return",
        )
    )
    common = [*base, "trainer.total_steps=4", "trainer.save_every=2", "data.val_files="]
    run("grpo", load_config(None, [*common, "trainer.total_steps=2", f"reward.function={dying}:compute_score"]))
    (tmp_path / "armed").touch()
    with pytest.raises(StepFailed, match=r"step 3 failed.*last checkpoint is step 2.*trainer.resume=true"):
        run("grpo", load_config(None, [*common, f"reward.function={dying}:compute_score", "trainer.resume=true"]))
    run_dir = run("grpo", load_config(None, [*common, "trainer.resume=true"]))
    assert [r["step"] for r in rows(run_dir)] == [1, 2, 3, 4]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_4"


def test_bad_config_paths_are_named(base, tmp_path):
    with pytest.raises(ValueError, match="actor.model"):
        run("grpo", load_config(None, [*base, f"actor.model={tmp_path / 'nope'}"]))
    with pytest.raises(ValueError, match="not found"):
        run("grpo", load_config(None, [*base, f"data.train_files={tmp_path / 'missing.parquet'}"]))
    with pytest.raises(ValueError, match="rollout.n must be >= 2"):
        run("dpo", load_config(None, [*base, "rollout.n=1"]))
