"""The learning claim, end to end on the bundled task (the main job, shorter): the SFT warm-up, then GRPO
through the mesh raises greedy accuracy on 500 held-out problems by several standard errors of the gain,
and so does sampling a step ahead (trainer.max_staleness=1), by nearly as much as the synchronous run;
so do partial rollouts (rollout.partial), a LoRA adapter, the same run placed by `meshrl ray` across
nodes, on-policy distillation from the GRPO run's model, and a learned judge grading alone. One warm-up
serves them all.

The bar is a z-score, not a fixed number of points: a gain of GAIN_Z paired standard errors holds on any
machine where the code is right (CPU kernels differ, so the exact accuracies do), and a run that cannot
learn misses it. The controls show the latter; they repeat the run, so they are not in the default suite:
    bash scripts/test.sh tests/e2e/test_learning.py -m control
"""

import json

import pytest
import yaml

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.main import run
from orchestrator.output.report import gain_line, held_out_gain
from orchestrator.ray_launch import run as ray_run

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
GAIN_Z = 4.0  # the gain in paired standard errors the test asks for
AHEAD_SHARE = 0.8  # of the synchronous run's gain, sampling a step ahead must reach
GRPO_STEPS = 40
SHORT_STEPS = 20  # the runs whose gain at 20 steps is far past the bar (see their docstrings)
COMMON = ["actor.engine=plain", "actor.world_size=1", "reward.workers=1", "trainer.trace="]


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> dict:
    """The SFT warm-up every GRPO run here starts from, and the task's data."""
    root = tmp_path_factory.mktemp("warm")
    model = make_model(root / "model", TinyModelConfig())
    data = make_data(root / "data", ArithmeticConfig())  # the main job's task: 500 held-out problems
    sft = run(
        "sft",
        load_config(
            str(ROOT / "configs/arithmetic_sft.yaml"),
            [*COMMON, f"data.train_files={data['train']}", f"actor.model={model}", f"trainer.run_dir={root / 'sft'}"],
        ),
    )
    return {"model": sft / "hf", "data": data}


def learn(warm: dict, run_dir, *grpo_overrides: str, command: str = "grpo", steps: int = GRPO_STEPS):
    """GRPO (or `command`) on the default task from the warm-up (configs/arithmetic_grpo.yaml, as the main
    job runs it): the held-out gain and the run's folder."""
    data = warm["data"]
    grpo = run(
        command,
        load_config(
            str(ROOT / "configs/arithmetic_grpo.yaml"),
            [
                *COMMON,
                f"data.train_files={data['train']}",
                f"actor.model={warm['model']}",
                f"data.val_files={data['test']}",
                f"trainer.run_dir={run_dir}",
                f"trainer.total_steps={steps}",
                f"trainer.val_every={steps}",
                *grpo_overrides,
            ],
        ),
    )
    gain = held_out_gain(grpo)
    assert gain is not None and gain["n"] == 500
    print(gain_line(gain))
    return gain, grpo


def learned(gain: dict) -> bool:
    return gain["gain"] > 0 and gain["gain"] >= GAIN_Z * gain["gain_se"]


@pytest.fixture(scope="module")
def synchronous(warm, tmp_path_factory) -> tuple[dict, object]:
    return learn(warm, tmp_path_factory.mktemp("grpo"))


@pytest.mark.slow
def test_grpo_raises_held_out_accuracy(synchronous):
    gain, _ = synchronous
    assert learned(gain), gain_line(gain)


@pytest.mark.slow
def test_sampling_a_step_ahead_learns_about_as_much(warm, synchronous, tmp_path):
    """trainer.max_staleness=1 with the off-policy correction, the same steps and samples: it learns by the
    same bar and gains at least AHEAD_SHARE of the synchronous run's points. (A share, not a z-score of
    the difference: both runs score the same problems from the same start, so the paired error of their
    difference, ~1 point, is far below how much two runs that sample differently vary.)"""
    gain, _ = learn(warm, tmp_path, "trainer.max_staleness=1", "algorithm.rollout_is=token")
    sync = synchronous[0]
    print(f"one step ahead: {100 * gain['gain']:+.1f} points, synchronous: {100 * sync['gain']:+.1f}")
    assert learned(gain), gain_line(gain)
    assert gain["gain"] >= AHEAD_SHARE * sync["gain"], (gain_line(gain), gain_line(sync))


@pytest.mark.slow
def test_partial_rollouts_learn_by_the_same_bar(warm, tmp_path):
    """rollout.partial with two tokens a round: most answers (2-5 tokens and the end token) span rounds, and
    a step's slower groups go on in the next step on newer weights, corrected by token importance weights
    against the log-probs of the weights that sampled each token; it learns by the same bar. SHORT_STEPS:
    at 20 steps, on one core (`taskset -c 0 .venv/bin/python -m pytest -s tests/e2e/test_learning.py -k
    partial`), 0.508 -> 0.772, +26.4 +- 2.4 (11.1 s.e.) on 2026-11-29."""
    gain, grpo = learn(
        warm,
        tmp_path,
        "rollout.partial=true",
        "rollout.partial_tokens=2",
        "trainer.max_staleness=2",
        "algorithm.rollout_is=token",
        steps=SHORT_STEPS,
    )
    assert learned(gain), gain_line(gain)
    rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert sum(r["partial/carried_in_groups"] for r in steps) > 0  # groups were carried ...
    assert max(r["rollout/versions_per_sample/max"] for r in steps) >= 2  # ... and went on on newer weights
    assert all(r["async/staleness"] <= 2 for r in steps)


LORA = ["actor.lora_rank=16", "actor.lr=5e-4"]  # the main job's LoRA settings (README): 10x full fine-tuning's lr


@pytest.mark.slow
def test_a_lora_adapter_learns_by_the_same_bar(warm, tmp_path):
    """Only a rank-16 adapter trains (the base stays frozen) and only the adapter travels to the rollout; the
    KL term's ref log-probs come from the same actor with its adapter off (no ref service). The run leaves
    the merged model and the peft adapter folder."""
    # the whole run: at half of it the gain was 7 s.e. with one sampling and 3.9 with another (each sample's
    # own stream, issue 42), too near the bar to be a test
    gain, grpo = learn(warm, tmp_path, *LORA, "actor.use_kl_loss=true")
    assert learned(gain), gain_line(gain)
    assert (grpo / "hf" / "config.json").is_file() and (grpo / "hf_adapter" / "adapter_config.json").is_file()
    rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    assert all("actor/kl_loss" in r for r in rows if r["step"] >= 1)  # the ref's log-probs reached the loss


@pytest.mark.slow
def test_grpo_across_nodes_learns_by_the_same_bar(warm, nodes, tmp_path):
    """`meshrl ray` on a three-node cluster on this machine (tests/e2e/conftest.py): the same GRPO run from
    the same warm-up, with the actor's two ranks on two nodes and two rollout replicas each in a placement
    group of its own, the weights pushed by stream down a chain: the gain reaches the same bar. SHORT_STEPS:
    at 20 steps, on one core (`taskset -c 0 ... -k across_nodes`), 0.508 -> 0.778, +27.0 +- 2.3 (11.6 s.e.)
    on 2026-11-29, half the time of the 40-step run it was."""
    data = warm["data"]
    cfg = load_config(
        str(ROOT / "configs/arithmetic_grpo.yaml"),
        [
            *COMMON,
            f"data.train_files={data['train']}",
            f"actor.model={warm['model']}",
            f"data.val_files={data['test']}",
            f"trainer.run_dir={tmp_path / 'grpo'}",
            f"trainer.total_steps={SHORT_STEPS}",
            f"trainer.val_every={SHORT_STEPS}",
            "actor.engine=fsdp2",
            "actor.world_size=2",
            "ray.rank_strategy=STRICT_SPREAD",
            "rollout.replicas=2",
            "rollout.weight_transport=stream",
        ],
    )
    run_dir = ray_run("grpo", cfg)
    gain = held_out_gain(run_dir)
    assert gain is not None and gain["n"] == 500
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    print(gain_line(gain), "| actor", saved["actor"]["address"], "| replicas", saved["rollout"]["address"])
    assert learned(gain), f"{gain_line(gain)} (the bar: {GAIN_Z} standard errors)"


OPD_STEPS = GRPO_STEPS // 2
OPD_SHARE, OPD_Z = 0.5, 2.0  # of the teacher's own gain; in paired standard errors


def distilled(gain: dict, teacher: dict) -> bool:
    """A student cannot pass its teacher, so the bar is the teacher's: at least OPD_SHARE of the gain the
    teacher made from the same start, and a gain of OPD_Z standard errors. (The learning bar itself, 4 s.e.,
    would ask the student for most of a teacher that on this suite's pinned numerics gains 5.2 s.e.)"""
    return gain["gain"] >= OPD_SHARE * teacher["gain"] and gain["gain"] >= OPD_Z * gain["gain_se"]


@pytest.mark.slow
def test_distillation_from_the_grpo_run_teaches_the_warm_up_without_a_reward(warm, synchronous, tmp_path):
    """meshrl opd: the student (the SFT warm-up) samples, the GRPO run's model grades each sampled token (the
    teacher's log-prob minus the student's is the advantage), and no score reaches the update; in half
    GRPO's steps it makes at least half the teacher's gain, and its reverse KL to the teacher falls. Here
    (2 threads): +33.4 at step 10 against the teacher's +44.8; the suite's pinned numerics: +10.0 (4.2 s.e.)
    at step 20 against the teacher's +12.4."""
    teacher = synchronous[1] / "hf"
    gain, opd = learn(warm, tmp_path, f"teacher.model={teacher}", command="opd", steps=OPD_STEPS)
    assert distilled(gain, synchronous[0]), (gain_line(gain), gain_line(synchronous[0]))
    rows = [json.loads(line) for line in (opd / "metrics.jsonl").read_text().splitlines() if '"distill/' in line]
    kl = [r["distill/reverse_kl"] for r in rows]
    half = OPD_STEPS // 2  # one step's figure is noisy (0.21-0.62 seen): halves
    assert len(kl) == OPD_STEPS and sum(kl[half:]) < sum(kl[:half]), (kl, gain_line(gain))


@pytest.mark.slow
def test_a_judge_alone_grades_the_policy_and_it_learns(warm, synchronous, tmp_path):
    """A judge that learned the task (the synchronous GRPO run's model: it adds better than the warm-up it
    grades) and no rule reward: judge.reward_weight=0 leaves the reward service's scores only logged (the
    held-out accuracy is still the rule's). The judge, served by the run's own rollout service, is asked
    each question through a judge program (tests/e2e/solving_judge.py: an answer is right when the judge's
    own answer is the same; it never sees the ground truth). The policy learns by the same bar."""
    gain, grpo = learn(
        warm,
        tmp_path,
        f"judge.model={synchronous[1] / 'hf'}",
        f"judge.function={ROOT / 'tests/e2e/solving_judge.py'}:judge",
        "judge.reward_weight=0",
        "judge.max_new_tokens=4",
    )
    assert learned(gain), gain_line(gain)
    rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert all(0 < r["judge/calls"] <= 32 for r in steps)  # a question asked once for its 8 answers
    assert all(r["critic/score/mean"] == pytest.approx(r["judge/score/mean"], abs=1e-6) for r in steps)


SHUFFLED = [f"reward.function={ROOT / 'tests/e2e/shuffled_reward.py'}:compute_score", "reward.batched=true"]


@pytest.mark.control
@pytest.mark.parametrize(
    "broken",
    [
        ["actor.lr=1e-12"],  # the optimizer moves nothing (lr must be > 0)
        SHUFFLED,  # rewards shuffled over the batch: the same mean, no signal
    ],
    ids=["lr0", "shuffled-rewards"],
)
def test_a_run_that_cannot_learn_fails_the_bar(warm, tmp_path, broken):
    gain, _ = learn(warm, tmp_path, *broken)
    assert not learned(gain), gain_line(gain)


@pytest.mark.control
def test_distillation_from_the_student_itself_teaches_nothing(warm, tmp_path):
    """The teacher is the warm-up itself: every advantage is ~0 (the two log-probs of the same weights), the
    teacher's gain 0, and the student must not make OPD_Z standard errors."""
    gain, _ = learn(warm, tmp_path, f"teacher.model={warm['model']}", command="opd", steps=OPD_STEPS)
    assert not distilled(gain, {"gain": 0.0}), gain_line(gain)
