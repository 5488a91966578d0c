"""trainer.max_staleness: which weights sample each step, and that a slow trainer never gets a batch older
than K versions (a producer over a stand-in rollout: a lock, a weight version and a clock)."""

import threading
import time

import pytest

from orchestrator.sampling.pipeline import Producer, version_for


def test_the_weights_of_each_step_by_hand():
    # K=1, checkpoints at 2 and 4 (and the last, 6): after a checkpoint a step goes back to its weights
    assert [version_for(s, 1, 2) for s in range(1, 7)] == [0, 0, 2, 2, 4, 4]
    # K=2, no checkpoint before the last: s - 1 - K
    assert [version_for(s, 2, 0) for s in range(1, 7)] == [0, 0, 0, 1, 2, 3]
    assert [version_for(s, 0, 0) for s in range(1, 5)] == [0, 1, 2, 3]  # K=0: the synchronous loop


class Rollout:
    """Generation and weight loading exclude each other, as in the rollout service."""

    def __init__(self, gen_s: float):
        self.lock, self.version, self.gen_s, self.sampled = threading.Lock(), 0, gen_s, {}

    def sample(self, step, prompts, on_generated):
        with self.lock:
            version = self.version
            time.sleep(self.gen_s)
            self.sampled[step] = version
        on_generated(step)
        return type("Gen", (), {"meta_info": {"weight_version": version}})(), None, {}

    def push(self, version):
        with self.lock:
            self.version = version


def train(k: int, deterministic: bool, steps=8, save_every=0, gen_s=0.01, train_s=0.03):
    rollout = Rollout(gen_s)
    draws = iter(range(100))

    def draw():
        i = next(draws)
        return [i], [f"u{i}"], None, {"position": i + 1}

    p = Producer(
        rollout.sample, draw, first=1, last=steps, staleness=k, save_every=save_every, deterministic=deterministic
    )
    got = {}
    try:
        for step in range(1, steps + 1):
            *_, version = p.take(step)
            got[step] = version
            time.sleep(train_s)  # the actor is slower than the rollout: the producer runs ahead
            p.before_push(step)
            rollout.push(step)
            p.after_push(step)
    finally:
        p.stop()
    assert got == rollout.sampled
    assert p.sampler_state(3) == {"position": 3}
    return got


@pytest.mark.parametrize("k, save_every", [(1, 0), (2, 0), (1, 3), (3, 4)])
def test_deterministic_steps_are_sampled_from_the_rules_weights(k, save_every):
    got = train(k, True, save_every=save_every)
    assert got == {s: version_for(s, k, save_every) for s in range(1, 9)}


@pytest.mark.parametrize("k", [1, 2])
def test_a_batch_is_never_older_than_k_versions(k):
    for got in (train(k, False), train(k, False, gen_s=0.03, train_s=0.005)):  # a slow actor, a slow rollout
        assert all(0 <= step - 1 - version <= k for step, version in got.items()), got


def test_a_failed_sampling_reaches_the_trainer():
    def sample(step, prompts, on_generated):
        raise RuntimeError(f"step {step}: the rollout died")

    p = Producer(sample, lambda: ([0], ["u0"], None, {}), first=1, last=3, staleness=1, save_every=0)
    with pytest.raises(RuntimeError, match="step 1: the rollout died"):
        p.take(1)
    p.stop()
