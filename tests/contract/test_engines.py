"""Training engines alone, on real gloo process groups: each engine against the plain one.

Every configuration runs the same step (forward, token-mean NLL backward, AdamW
step) on the same batch; sharded runs use 2 ranks, each with half the rows (one
prompt sampled twice: with --share the rows run it once).
"""

import json
import pathlib

import pytest
import torch
from engine_ranks import P, T, batch
from engine_runs import launch, run
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


@pytest.fixture(scope="module")
def reference(tiny_lm, tmp_path_factory):
    return run(1, "plain", tiny_lm, tmp_path_factory.mktemp("plain"))


def assert_same_step(a: dict, b: dict, as_files=lambda weights: weights):
    """as_files: the weights as a push sends them (a mixture of experts': per expert, as its files hold them)."""
    assert a["stats"]["loss"] == pytest.approx(b["stats"]["loss"], rel=1e-6)
    assert a["stats"]["grad_norm"] == pytest.approx(b["stats"]["grad_norm"], rel=1e-5)  # catches a wrong scale
    assert set(a["weights"]) == set(b["weights"])
    # AdamW's first step moves each weight by ~lr * sign(grad): where a gradient is ~0, float noise in the
    # reduction order can flip its sign. So: nearly every weight within 1e-5, none off by more than 2 steps.
    total = off = 0
    for k in a["weights"]:
        diff = (a["weights"][k] - b["weights"][k]).abs()
        assert diff.max() <= 2.5e-3, k
        total, off = total + diff.numel(), off + int((diff > 1e-5).sum())
    assert off / total < 1e-3, f"{off} of {total} weights differ by more than 1e-5"
    assert torch.allclose(a["logprobs"], b["logprobs"], atol=1e-5)
    for one in (a, b):  # a push, gathering a block at a time, sends exactly the state dict's weights
        sent = as_files(one["weights"])
        assert one["pushed"].keys() == sent.keys()
        assert all(torch.equal(one["pushed"][k], sent[k]) for k in sent)


def test_plain_engine_learns(reference):
    s = reference["stats"]
    assert s["skipped"] == 0.0 and s["grad_norm"] > 0 and s["lr"] == 1e-3
    before = -s["loss"]  # mean response log-prob before the step
    mask = batch()["response_mask"]
    after = (reference["logprobs"] * mask).sum() / mask.sum()
    assert after > before  # one NLL step raised the log-probs of the data


@pytest.mark.parametrize(
    "engine,flags",
    [
        ("fsdp2", []),
        ("fsdp1", []),
        ("fsdp2", ["--hsdp", "2"]),
        ("fsdp2", ["--grad-ckpt", "--padding-free"]),  # micro-batches of 2 rows, packed, recomputed in the backward
        ("fsdp2", ["--share"]),
        ("fsdp1", ["--share"]),
        ("fsdp2", ["--grad-ckpt", "--padding-free", "--share"]),  # the shared prompt once in the packed row
    ],
    ids=[
        "fsdp2",
        "fsdp1",
        "hsdp",
        "fsdp2-gradient-checkpointing-padding-free",
        "fsdp2-shared-prompts",
        "fsdp1-shared-prompts",
        "fsdp2-gradient-checkpointing-packed-shared-prompts",
    ],
)
def test_two_ranks_match_one_process(reference, tiny_lm, tmp_path, engine, flags):
    two = run(2, engine, tiny_lm, tmp_path, *flags)
    assert_same_step(reference, two)
    # a cuda_ipc push from both ranks: rank 0 sends both ranks' copies of each bucket, its own first
    assert two["shared"] and all(s == {"gpus": ["rank-0", "rank-1"], "same": True} for s in two["shared"])


@pytest.mark.parametrize(
    "world,flags",
    [
        (2, ["--padding-free", "--sp", "2"]),
        (2, ["--grad-ckpt", "--padding-free", "--share", "--sp", "2"]),  # the shared prompts' row, split
        (4, ["--hsdp", "2", "--padding-free", "--sp", "4"]),  # 2 kv heads over 4 ranks: repeated to the 4 heads
    ],
    ids=["fsdp2-sp2", "fsdp2-sp2-gradient-checkpointing-packed-shared-prompts", "hsdp-sp4"],
)
def test_sequence_parallel_ranks_match_one_process(reference, tiny_lm, tmp_path, world, flags):
    """Each packed row's tokens split over the group's ranks (Ulysses): the same loss, gradient norm,
    log-probs and weights after the step as one process with every row."""
    assert_same_step(reference, run(world, "fsdp2", tiny_lm, tmp_path, *flags))


def test_a_tied_model_sharded_from_rank0_keeps_its_tie(tiny_lm, tmp_path):
    """fsdp2 ranks other than 0 build the model on the meta device and receive rank 0's weights: a model
    whose lm_head is its embedding must still train as one tensor there (and its rotary buffers, which no
    state dict carries, must be rank 0's)."""
    from meshrl.tiny.models import TinyModelConfig, make_model

    tied = make_model(tmp_path / "tied", TinyModelConfig(tie_word_embeddings=True))
    one, two = run(1, "plain", tied, tmp_path / "one"), run(2, "fsdp2", tied, tmp_path / "two")
    assert_same_step(one, two)
    assert torch.equal(two["weights"]["lm_head.weight"], two["weights"]["model.embed_tokens.weight"])


def test_mixed_precision_stays_close(reference, tiny_lm, tmp_path):
    mixed = run(2, "fsdp2", tiny_lm, tmp_path, "--mixed-precision")
    assert mixed["stats"]["loss"] == pytest.approx(reference["stats"]["loss"], rel=1e-2)  # bf16 forward
    assert torch.allclose(mixed["logprobs"], reference["logprobs"], atol=0.1)


def test_checkpoint_round_trip_and_hf_export(tiny_lm, tmp_path):
    ckpt, hf = tmp_path / "ckpt", tmp_path / "hf"
    trained = run(2, "fsdp2", tiny_lm, tmp_path / "train", "--save", str(ckpt), "--export", str(hf))
    loaded = run(2, "fsdp2", tiny_lm, tmp_path / "load", "--load", str(ckpt))
    assert torch.equal(loaded["logprobs"], trained["logprobs"])  # a fresh service, the same model
    model = AutoModelForCausalLM.from_pretrained(hf)
    b = batch()
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits[:, P - 1 : -1]
    lp = torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    assert lp.shape == (4, T) and torch.allclose(lp, trained["logprobs"], atol=1e-5)
    for k, v in model.state_dict().items():
        assert torch.equal(v, trained["weights"][k]), k


def stopped_update(world: int, engine: str, model, out: pathlib.Path, *flags: str) -> dict:
    launch(world, engine, model, out, *flags)
    return {
        "stats": json.loads((out / "stats.json").read_text()),
        "before": load_file(out / "before.safetensors"),
        "weights": load_file(out / "weights.safetensors"),
    }


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def first_step_only(tiny_lm, tmp_path_factory):
    """An uncancelled SFT update on rows 0-1 alone: one optimizer step, the first of the 4-row update below."""
    return stopped_update(1, "plain", tiny_lm, tmp_path_factory.mktemp("first"), "--cancel-at", "0", "--rows", "2")


@pytest.mark.parametrize("stop_at", [3, 4], ids=["between-steps", "mid-mini-batch"])
def test_a_stopped_update_keeps_only_whole_optimizer_steps(first_step_only, tiny_lm, tmp_path, stop_at):
    """4 rows, mini-batches of 2 (an optimizer step each), micro-batches of 1: the caller goes away before
    the 3rd micro-batch (between the steps) or the 4th (halfway into the second step's gradients). Either
    way the weights are exactly those of the first step alone, and no gradient is left accumulated."""
    got = stopped_update(1, "plain", tiny_lm, tmp_path, "--cancel-at", str(stop_at))
    s = got["stats"]
    assert (s["optimizer_steps"], s["planned_steps"], s["gradients"]) == (1, 2, 0), s
    assert "after 1 of 2 optimizer steps" in s["message"]
    assert same_weights(got["weights"], first_step_only["weights"])
    assert not same_weights(got["weights"], got["before"])


def test_every_rank_stops_at_the_same_micro_batch(tiny_lm, tmp_path):
    """2 FSDP ranks, one mini-batch of 4 rows (2 micro-batches a rank): only rank 0 sees its caller go,
    after its first micro-batch. Both ranks stop there (no hang on the next collective), drop what they
    accumulated, and keep the weights they started with."""
    got = stopped_update(2, "fsdp2", tiny_lm, tmp_path, "--cancel-at", "2", "--mini", "4")
    assert (got["stats"]["optimizer_steps"], got["stats"]["gradients"]) == (0, 0), got["stats"]
    assert same_weights(got["weights"], got["before"])


def test_a_mixture_of_experts_trains_alike_on_every_engine(tmp_path):
    """A tiny Qwen3-MoE (fused 3-d experts, a router per layer): HSDP with packed passes recomputed in the
    backward takes the plain engine's step, so does sequence parallelism with the router's losses, and bf16
    mixed precision on fsdp2 stays close to it."""
    from transformers import AutoConfig

    from meshrl import file_layout
    from meshrl.tiny.models import TinyModelConfig, make_model

    moe = make_model(tmp_path / "moe", TinyModelConfig(family="qwen3_moe", num_experts=4))
    shell = file_layout.shell(AutoConfig.from_pretrained(moe))
    one = run(1, "plain", moe, tmp_path / "one")
    hsdp = run(2, "fsdp2", moe, tmp_path / "hsdp", "--hsdp", "2", "--grad-ckpt", "--padding-free")
    assert_same_step(one, hsdp, as_files=lambda weights: file_layout.to_files(shell, weights))
    # its router losses read the whole row also when its tokens are split over the ranks (sequence parallel)
    losses = ("--padding-free", "--router-losses")  # the same micro-batches (2 rows) on both sides
    alone = run(1, "plain", moe, tmp_path / "alone", *losses)
    split = run(2, "fsdp2", moe, tmp_path / "split", *losses, "--sp", "2")
    assert_same_step(alone, split, as_files=lambda weights: file_layout.to_files(shell, weights))
    mixed = run(2, "fsdp2", moe, tmp_path / "mixed", "--mixed-precision")
    assert mixed["stats"]["loss"] == pytest.approx(one["stats"]["loss"], rel=1e-2)
    assert torch.allclose(mixed["logprobs"], one["logprobs"], atol=0.1)
