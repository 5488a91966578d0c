"""In-flight weight updates' parts (services/rollout/gate.py, layout.token_versions, versions_spanned): the
gate's pause waits only for the steps running, a parked call goes on with the new version or, its caller
gone, lets go; each token's version, and how many versions a response spans."""

import threading
import time

import pytest
import torch

from meshrl.config.checked import FieldError
from meshrl.config.rollout import RolloutConfig
from orchestrator.loops.policy_gradient import versions_spanned
from services.rollout.gate import Gate
from services.rollout.layout import token_versions
from services.rollout.sampling import Completion


def test_pause_waits_for_the_running_step_and_a_parked_call_goes_on_with_the_new_version():
    gate, seen, in_step, release = Gate(3), [], threading.Event(), threading.Event()

    def call():
        seen.append(gate.enter(lambda: True))
        in_step.set()
        release.wait()  # an engine step in progress
        seen.append(gate.step(lambda: True))  # parks: an update is loading
        gate.leave()

    worker = threading.Thread(target=call)
    worker.start()
    in_step.wait()
    paused = threading.Thread(target=gate.pause)
    paused.start()
    time.sleep(0.05)
    assert paused.is_alive(), "pause did not wait for the step running"
    release.set()
    paused.join(5)
    assert not paused.is_alive() and gate.running == 0
    time.sleep(0.05)
    assert seen == [3], "a call went past the closed gate"
    gate.resume(4)
    worker.join(5)
    assert seen == [3, 4] and gate.running == 0


def test_a_parked_call_whose_caller_left_lets_go():
    gate, here = Gate(0), [True]
    gate.enter(lambda: True)
    threading.Timer(0.05, gate.pause).start()
    threading.Timer(0.3, here.clear).start()  # its caller goes away while it is parked
    time.sleep(0.15)
    assert gate.closed and gate.step(lambda: bool(here)) is None and gate.running == 0


def test_each_token_has_its_steps_version_and_a_response_spans_its_versions():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    lockstep = [Completion([], None, "", "stop")] * 3  # the HF backend: token t from step t
    got = token_versions(mask, lockstep, [2, 2, 3, 3, 3, 3], [2, 3])  # a check after the last token, as HF makes
    assert got.tolist() == [[2, 2, 3, 3, 0], [2, 2, 0, 0, 0], [2, 2, 3, 3, 3]]
    assert token_versions(mask, lockstep, [5], [5]).tolist() == (mask * 5).tolist()
    assert versions_spanned(got, mask).tolist() == [2.0, 1.0, 2.0]
    # per sample (vLLM): the token counts at which each update loaded during the call took effect for it; a
    # sample that had not started at the first update (count 0) has none of the oldest version; one that
    # ended before the second update has no second switch
    tracked = [Completion([], None, "", "stop", switches=s) for s in ([1, 3], [0], [4, 4])]
    got = token_versions(mask, tracked, [7] * 6, [7, 8, 9])
    assert got.tolist() == [[7, 8, 8, 9, 0], [8, 8, 0, 0, 0], [7, 7, 7, 7, 9]]
    assert versions_spanned(got, mask).tolist() == [3.0, 1.0, 2.0]
    # an update that loads the version in use again (a torn engine re-pushed, a rollback) still counts as one
    again = token_versions(mask, tracked[:1] * 3, [7] * 6, [7, 7, 6])
    assert again[0].tolist() == [7, 7, 7, 6, 0]


@pytest.mark.parametrize(
    "extra, why",
    [
        ({"engine_in_process": False}, "needs engine_in_process"),  # the engine's own process would step on
        ({"max_lora_rank": 8}, "cannot serve LoRA adapters on vLLM"),  # a push drops the adapter they name
    ],
)
def test_what_keep_cannot_do_on_vllm_is_refused(extra, why):
    for mode in ("keep", "recompute"):
        with pytest.raises(FieldError, match=f"on_update={mode} {why}"):
            RolloutConfig(model="m", backend="vllm", on_update=mode, **extra)
    for mode in ("keep", "recompute"):  # the hf backend steps in this process
        RolloutConfig(model="m", backend="hf", on_update=mode, **extra)
