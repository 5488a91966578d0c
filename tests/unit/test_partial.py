"""rollout.partial (orchestrator.sampling.partial): rounds, carried samples, whole groups, the staleness
bound, and the carry's round trip through a checkpoint. The rollout here is a scripted model behind the
rollout's own layout code: prompt i answers with tokens 1, 2, ... and ends (an end token) after
LENGTHS[i] tokens, whatever calls it is cut into, so a carried sample must come out as one call would
give it."""

import json

import pytest
import torch

from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto
from meshrl.layout import VERSIONS
from orchestrator.config import load_config
from orchestrator.sampling.partial import Carry, Group, Partial, Sample, to_state
from services.rollout import layout
from services.rollout.sampling import Completion

END, PAD = 99, 0
LENGTHS = [2, 11, 3, 4, 2, 2, 7, 3, 2, 2, 2, 2, 2, 2, 2, 2]  # prompt i's answer: LENGTHS[i] tokens, end included


def logprob(position: int) -> float:
    return -0.01 * position


class Data:
    """A dataset of two-token prompts [100 + i, 7]."""

    pad = PAD
    prompt_ids = [[100 + i, 7] for i in range(len(LENGTHS))]

    def batch(self, indices, uids):
        ids = torch.tensor([self.prompt_ids[i] for i in indices])
        mask = torch.ones_like(ids)
        return DataProto(
            {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
            {"uid": list(uids), "data_source": [f"row{i}" for i in indices]},
        )


class Tokenizer:
    def decode(self, tokens, skip_special_tokens=True):
        return " ".join(str(t) for t in tokens if not (skip_special_tokens and t == END))


class Mesh:
    def __init__(self, cfg):
        self.cfg, self.version, self.calls = cfg, 0, []

    def colocated_generation(self):
        return __import__("contextlib").nullcontext()

    def generate(self, prompts, seed, n, max_new_tokens, colocated):
        self.calls.append((len(prompts), n, max_new_tokens, seed))
        rows = [r[m.bool()].tolist() for r, m in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]
        completions = []
        for row in rows:
            index, done = row[0] - 100, len(row) - 2  # the prompt's row, and the tokens it had
            length = LENGTHS[index]
            assert done + max_new_tokens <= self.cfg.rollout.max_new_tokens  # never past the response limit
            new = [t if t < length else END for t in range(done + 1, min(length, done + max_new_tokens) + 1)]
            finish = "stop" if new[-1] == END else "length"
            c = Completion(new, [logprob(done + k) for k in range(len(new))], "", finish)
            completions.append([c] * n)
        out = layout.build(DataProto(), rows, completions, PAD, with_logprobs=True)
        out.meta_info["weight_version"] = self.version
        return out

    def score(self, gen):
        scores = gen.batch["response_mask"].sum(-1)
        return Scores(scores, None, {}, {})


def config(*extra):
    return load_config(
        None,
        [
            "data.train_batch_size=2",
            "rollout.n=2",
            "rollout.max_new_tokens=8",
            "rollout.partial=true",
            "rollout.partial_tokens=3",
            "trainer.max_staleness=2",
            *extra,
        ],
    )


class Sampler:
    """The run's sampler: two prompts a batch, in order."""

    def __init__(self, position=0):
        self.position = position

    def next(self):
        a = self.position
        self.position = (a + 2) % len(LENGTHS)
        return [a, a + 1], [f"u{a}", f"u{a + 1}"]


def steps(partial, mesh, first, last, sampler):
    out = []
    for step in range(first, last + 1):
        mesh.version = step - 1
        out.append(partial.sample(mesh, step, *sampler.next(), more=sampler.next))
        partial.commit()
    return out


def response(index):
    length = LENGTHS[index]
    return [t if t < length else END for t in range(1, min(length, 8) + 1)]


def test_carried_samples_come_out_whole_with_each_tokens_version_and_logprob():
    cfg = config()
    partial, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    (gen1, _, _, m1), (gen2, _, _, m2), (gen3, _, _, m3) = steps(partial, mesh, 1, 3, Sampler())
    # step 1: prompts 0 (2 tokens) and 1 (11: clipped at 8) start; 0 is done after one round, 1 needs three,
    # and prompts 2 and 3 start in its place meanwhile (the pool stays at two unfinished groups)
    assert list(gen1.non_tensor_batch["uid"]) == ["u0", "u0", "u2", "u2"]
    assert m1["partial/rounds"] == 2 and m1["partial/carried_samples"] == 2  # prompt 1's two
    for gen in (gen1, gen2, gen3):
        b = gen.batch
        for row, uid in enumerate(gen.non_tensor_batch["uid"]):
            index = int(uid[1:])
            want = response(index)
            n = len(want)
            assert b["responses"][row, :n].tolist() == want
            assert b["response_mask"][row].sum() == n
            assert torch.allclose(b["rollout_logprobs"][row, :n], torch.tensor([logprob(k) for k in range(n)]))
            assert b["input_ids"][row, -b["responses"].shape[1] :].tolist()[:n] == want
    # step 2 trains what step 1 carried (3 finished in its first round, 1 in its third token round)
    assert list(gen2.non_tensor_batch["uid"]) == ["u1", "u1", "u3", "u3"]
    rows = {uid: i for i, uid in enumerate(gen2.non_tensor_batch["uid"])}
    versions = gen2.batch[VERSIONS][rows["u1"], :8].tolist()
    assert versions == [0, 0, 0, 0, 0, 0, 1, 1]  # two rounds of 3 tokens on version 0, the rest on 1
    assert gen2.meta_info["weight_version"] == 0 and m2["async/staleness"] == 1.0
    assert list(gen2.non_tensor_batch["finish_reason"][rows["u1"] : rows["u1"] + 1]) == ["length"]
    assert gen2.non_tensor_batch["data_source"][rows["u3"]] == "row3"
    assert gen2.non_tensor_batch["response_text"][rows["u3"]] == "1 2 3"


def test_the_oldest_finished_groups_train_first_and_groups_stay_whole():
    cfg = config()
    partial, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    for gen, _, _, _ in steps(partial, mesh, 1, 6, Sampler()):
        uids = list(gen.non_tensor_batch["uid"])
        assert len(uids) == 4 and all(uids.count(u) == 2 for u in uids)  # two whole groups of two
        versions = gen.batch[VERSIONS][gen.batch["response_mask"] > 0]
        assert versions.min() == gen.meta_info["weight_version"]


def test_a_carried_sample_past_the_staleness_bound_is_dropped():
    cfg = config("trainer.max_staleness=1", "rollout.partial_tokens=1", "rollout.max_new_tokens=16")
    partial, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    for step, (gen, *_) in enumerate(steps(partial, mesh, 1, 6, Sampler()), 1):
        assert step - 1 - gen.meta_info["weight_version"] <= 1  # every trained token within the bound
    begun = dict(tokens=[1, 2, 3], logprobs=[0.0] * 3, finish="length", done=False)
    partial.load_state_dict(
        to_state(
            Carry(
                [],
                [
                    Group(1, "old", [Sample(**begun, versions=[2, 2, 3]) for _ in range(2)]),  # at step 5: stale
                    Group(6, "kept", [Sample(**begun, versions=[3, 3, 3]) for _ in range(2)]),
                ],
            )
        )
    )
    mesh.version = 4
    gen, _, _, m = partial.sample(mesh, 5, [2, 3], ["a", "b"], more=Sampler(4).next)
    assert m["partial/dropped_groups"] == 1 and m["partial/carried_in_groups"] == 1
    assert "old" not in list(gen.non_tensor_batch["uid"])
    assert all(g.uid != "old" for g in partial.pending.groups)
    assert gen.meta_info["weight_version"] >= 3


def checkpointed(partial):
    """Its state as a checkpoint holds it: JSON, and the tensors in their own file."""
    state = partial.state_dict()
    tensors = {k: v.clone() for k, v in state.pop("tensors").items()}
    return {**json.loads(json.dumps(state)), "tensors": tensors}


def same(a, b):
    assert set(a.batch) == set(b.batch)
    for k in a.batch:
        assert torch.equal(a.batch[k], b.batch[k]), k
    assert list(a.non_tensor_batch["uid"]) == list(b.non_tensor_batch["uid"])


def test_a_resumed_carry_samples_what_an_uninterrupted_one_does():
    cfg = config()
    whole, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    want = steps(whole, mesh, 1, 5, Sampler())
    first, sampler = Partial(cfg, Data(), Tokenizer()), Sampler()
    steps(first, Mesh(cfg), 1, 2, sampler)
    resumed, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    resumed.load_state_dict(checkpointed(first))
    for (a, *_), (b, *_) in zip(want[2:], steps(resumed, mesh, 3, 5, Sampler(sampler.position))):
        same(a, b)


class Failing(Mesh):
    """Fails its k-th Generate (a rollout lost mid-step), once."""

    def __init__(self, cfg, k):
        super().__init__(cfg)
        self.k = k

    def generate(self, *args, **kwargs):
        if len(self.calls) == self.k:
            self.k = -1
            raise RuntimeError("the rollout died")
        return super().generate(*args, **kwargs)


@pytest.mark.parametrize("k", [0, 2, 1000], ids=["at-once", "after-a-draw", "after-sampling"])
def test_a_failed_step_is_done_again_from_its_carry_with_the_prompts_it_drew(k):
    """Done again as the run loop does it: the step's batch and the sampler as the failure left them (step
    1 draws a second batch before its third call); the first attempt's draws are replayed, and an attempt
    that had sampled it all is taken as it was."""
    cfg = config()
    whole, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    want = steps(whole, mesh, 1, 4, Sampler())
    partial, sampler, mesh = Partial(cfg, Data(), Tokenizer()), Sampler(), Failing(cfg, k)
    batch = sampler.next()
    try:
        first = partial.sample(mesh, 1, *batch, more=sampler.next)
    except RuntimeError:
        first = None
    assert (first is None) == (k < 1000)
    again = partial.sample(mesh, 1, *batch, more=sampler.next)
    if first is not None:
        assert again[0] is first[0]  # the samples it had, not sampled again
    partial.commit()
    same(want[0][0], again[0])
    for (a, *_), (b, *_) in zip(want[1:], steps(partial, mesh, 2, 4, sampler)):
        same(a, b)


def test_near_the_limit_a_sample_asks_only_for_what_is_left_and_the_rounds_run_at_once():
    cfg = config("rollout.partial_tokens=5")
    partial, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    steps(partial, mesh, 1, 2, Sampler())
    budgets = {b for _, n, b, _ in mesh.calls if n == 1}
    assert budgets == {3}  # prompt 1 carried after 5 tokens: 3 left of 8
    assert {b for _, n, b, _ in mesh.calls if n == 2} == {5}  # new groups: rollout.n each, the round's tokens


def test_more_prompts_come_from_the_sampler_when_the_batch_runs_short():
    cfg = config()
    partial, mesh = Partial(cfg, Data(), Tokenizer()), Mesh(cfg)
    drawn = iter([([4, 5], ["u4", "u5"]), ([6, 7], ["u6", "u7"])])
    gen, *_ = partial.sample(mesh, 1, [0, 1], ["u0", "u1"], more=lambda: next(drawn))
    assert len(gen) == 4
    with pytest.raises(RuntimeError, match="ran out of prompts"):
        Partial(cfg, Data(), Tokenizer()).sample(mesh, 1, [1], ["u1"], more=None)
