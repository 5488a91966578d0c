"""The bundled visual task through the whole mesh: a tiny Qwen2-VL (meshrl make-model --family qwen2_vl), its
pictures read from verl's multimodal schema, an SFT warm-up and GRPO (configs/visual_*.yaml) with the hf
rollout generating from the pictures, the reward service scoring the answers, and the actor training the
language model and the vision tower. Held-out greedy accuracy on pictures never trained on rises by the
learning tests' bar, and the rollout stays in parity with the actor."""

from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.tiny.visual import VisualConfig, make_data
from testkit.recipe import check_gain, steps_run, warm_up_and_grpo

GAIN_Z = 4.0  # tests/e2e/test_learning.py's bar, in paired standard errors (6.1 seen at 60 steps here)


def test_the_visual_task_learns_from_pictures(tmp_path):
    model = make_model(tmp_path / "model", TinyModelConfig(family="qwen2_vl"))
    data = make_data(tmp_path / "data", VisualConfig())  # 300 held-out pictures
    steps = 60
    grpo = warm_up_and_grpo("visual", tmp_path, model, data, steps)
    check_gain(grpo, 300, GAIN_Z)
    logged = steps_run(grpo)
    assert len(logged) == steps and all(m["rollout/kl_to_actor"] < 1e-4 for m in logged)
