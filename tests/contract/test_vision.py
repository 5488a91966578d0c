"""Vision-language models end to end through the services: a tiny Qwen2-VL (one vision block), prompts with
pictures read by the orchestrator's reader (verl's `<image>` + images column), generated from by the hf
rollout, and scored by the actor (FSDP2 over two ranks, packed and padded passes) at the rollout's
log-probs; a trained actor's push lands in the rollout, vision tower included; bad pictures are refused."""

import io
import json

import grpc
import pandas as pd
import pytest
import torch
from actor_process import Service
from calls import chats, expect, generate, serve
from PIL import Image

from meshrl.algos.rollout_correction import kl_to_actor
from meshrl.dataproto import DataProto
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import actor_pb2
from orchestrator.data import PromptDataset

SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}
PARITY = 1e-5  # mean |rollout - actor| log-prob, as for text (fp32 measures ~1e-7)
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220)}


def png(colour, size=(56, 56)) -> bytes:
    img = Image.new("RGB", size, (255, 255, 255))
    img.paste(COLOURS[colour], (8, 8, size[0] - 8, size[1] - 8))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("vl") / "m", TinyModelConfig(family="qwen2_vl", **SMALL))


@pytest.fixture(scope="module")
def prompts(folder, tmp_path_factory):
    """The reader's batch: three rows, one with two pictures of other sizes (84 x 56 and 28 x 28)."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("data") / "rows.parquet"
    rows = [
        {"prompt": [{"role": "user", "content": "<image>colour?"}], "images": [{"bytes": png("red"), "path": None}]},
        {"prompt": [{"role": "user", "content": "<image>colour?"}], "images": [{"bytes": png("blue"), "path": None}]},
        {
            "prompt": [{"role": "user", "content": "<image> then <image>?"}],
            "images": [{"bytes": png("green", (84, 56)), "path": None}, {"bytes": png("red", (28, 28)), "path": None}],
        },
    ]
    pd.DataFrame(rows).to_parquet(path)
    data = PromptDataset(str(path), AutoTokenizer.from_pretrained(folder), 200, model=str(folder))
    return data.batch([0, 1, 2], ["a", "b", "c"])


@pytest.fixture(scope="module")
def rollout(folder):
    servicer, server, client = serve(folder, max_model_len=200, max_lora_rank=8)
    yield servicer, server, client
    client.close()
    server.stop(0)
    servicer.close()


def test_the_reader_expands_each_picture_to_its_patches(prompts, folder):
    ids = prompts.batch["input_ids"]
    image = json.loads((folder / "config.json").read_text())["image_token_id"]  # <|image_pad|>
    # 56 x 56: 4 x 4 patches of 14, merged 2 x 2 -> 4 tokens; 84 x 56 -> 6; 28 x 28 (Qwen2-VL's floor is
    # 56 x 56: scaled up) -> 4
    assert (ids == image).sum(1).tolist() == [4, 4, 10]
    assert [len(p) for p in prompts.non_tensor_batch["images"]] == [1, 1, 2]


# packed with shared prompts (rows 0-3 have the same ids and two pictures: two prompts), and padded; packed
# without sharing equals both (tests/unit/test_pictures.py)
@pytest.mark.parametrize("flags", [(), ("--no-padding-free",)], ids=["packed shared", "padded"])
def test_the_actor_scores_the_rollouts_pictures_at_its_log_probs(folder, prompts, rollout, flags):
    _, _, client = rollout
    out = generate(client, prompts, n=2, max_new_tokens=6, seed=3).data
    assert len(out) == 6 and len(out.non_tensor_batch["images"][5]) == 2
    actor = Service(
        "--role", "actor", "--model", str(folder), "--world-size", "2", "--micro-batch-tokens", "120", *flags
    )
    try:
        lp = actor.logprobs(out)
        mask = out.batch["response_mask"]
        assert kl_to_actor(out.batch["rollout_logprobs"], lp, mask) < PARITY
        # the pictures matter: the same ids with other pictures give other log-probs
        swapped = DataProto(
            out.batch,
            {**out.non_tensor_batch, "images": [[png("green")]] * 4 + list(out.non_tensor_batch["images"][4:])},
        )
        assert (actor.logprobs(swapped) - lp).abs()[mask.bool()].max() > 1e-4
        # and a batch that lost them is refused, not scored on the image tokens' own embeddings
        blind = DataProto(out.batch, {k: v for k, v in out.non_tensor_batch.items() if k != "images"})
        expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: actor.logprobs(blind), "row 0 holds image tokens, but")
    finally:
        actor.stop()


def tower_moved(servicer, folder) -> bool:
    """The rollout's vision tower differs from the model folder's."""
    from transformers import AutoModelForImageTextToText

    loaded = dict(AutoModelForImageTextToText.from_pretrained(folder).named_parameters())
    held = {n: p for n, p in servicer.backend.model.named_parameters() if ".visual." in n}
    assert held and all(n in loaded for n in held)
    return any(not torch.equal(loaded[n], p) for n, p in held.items())


@pytest.mark.parametrize(
    "flags, trained",
    # the adapter first: it goes onto the rollout's base weights, which a full push replaces
    [(("--lora-rank", "4"), False), (("--no-freeze-vision",), True), ((), False)],
    ids=["lora", "whole", "frozen tower"],
)
def test_a_trained_vision_model_pushes_to_the_rollout(folder, prompts, rollout, flags, trained):
    """A PPO step moves the language model, and the vision tower only where it is trained (by default it is
    frozen, and with LoRA it gets no adapter); the push lands it in the rollout, in parity."""
    servicer, server, client = rollout
    out = generate(client, prompts, n=2, max_new_tokens=6, seed=4).data
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", "2", "--lr", "1e-2", *flags)
    try:
        out.batch["advantages"] = out.batch["response_mask"] * torch.tensor([1.0, -1.0] * 3)[:, None]
        metrics = actor.update(1, "ppo", out, old_logprobs_key="").metrics
        assert metrics["actor/grad_norm"] > 0
        version = servicer.version + 1
        push = actor_pb2.PushWeightsRequest(rollout_address=server.address, version=version)
        assert actor.call("PushWeights", push).version == version
        assert tower_moved(servicer, folder) == trained
        again = generate(client, prompts, n=2, max_new_tokens=6, seed=5).data
        mask = again.batch["response_mask"]
        assert kl_to_actor(again.batch["rollout_logprobs"], actor.logprobs(again), mask) < PARITY
    finally:
        actor.stop()


def test_bad_pictures_are_refused_naming_the_row(prompts, rollout, tmp_path, folder):
    _, _, client = rollout
    broken = DataProto(prompts.batch, {**prompts.non_tensor_batch, "images": [[b"not a picture"]] * 3})
    refused = grpc.StatusCode.INVALID_ARGUMENT
    expect(refused, lambda: generate(client, broken), "row 0 image 0: an image cannot be decoded")
    fewer = DataProto(prompts.batch, {**prompts.non_tensor_batch, "images": [[png("red")]] * 3})
    expect(refused, lambda: generate(client, fewer), "row 2: the prompt holds 10 image tokens")
    blind = DataProto(prompts.batch, {k: v for k, v in prompts.non_tensor_batch.items() if k != "images"})
    expect(refused, lambda: generate(client, blind), "row 0 holds image tokens, but the batch carries no pictures")
    from transformers import AutoTokenizer

    path = tmp_path / "bad.jsonl"
    pd.DataFrame([{"prompt": "<image>hi", "images": ["missing.png"]}]).to_json(path, orient="records", lines=True)
    with pytest.raises(ValueError, match="row 0 image 0: image 'missing.png' cannot be read"):
        PromptDataset(str(path), AutoTokenizer.from_pretrained(folder), 200, model=str(folder))


def test_rows_without_pictures_beside_rows_with_them_and_text_calls_after_them(folder, rollout, tmp_path_factory):
    """Two ranks whose rows differ: rank 0's have pictures, rank 1's none (the tower must still run on rank
    1, or FSDP's gathers of its weights would wait forever); then text-only calls to a rollout that ran
    pictures before (transformers' Qwen2-VL keeps the last call's position offsets), each at parity."""
    from transformers import AutoTokenizer

    servicer, server, client = rollout
    path = tmp_path_factory.mktemp("mixed") / "rows.parquet"
    rows = [{"prompt": "<image>colour?", "images": [{"bytes": png(c), "path": None}]} for c in ("red", "blue")]
    rows += [{"prompt": f"colour {i}?", "images": []} for i in range(4)]
    pd.DataFrame(rows).to_parquet(path)
    data = PromptDataset(str(path), AutoTokenizer.from_pretrained(folder), 200, model=str(folder))
    batch = data.batch(list(range(6)), [f"u{i}" for i in range(6)])
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", "2", "--no-freeze-vision")
    try:
        # the rollout takes this actor's weights first: the tests before may have pushed it others
        push = actor_pb2.PushWeightsRequest(rollout_address=server.address, version=servicer.version + 1)
        actor.call("PushWeights", push)
        out = generate(client, batch, n=1, max_new_tokens=6, seed=6).data
        mask = out.batch["response_mask"]
        assert kl_to_actor(out.batch["rollout_logprobs"], actor.logprobs(out), mask) < PARITY
        for n in (2, 1):  # n > 1 takes the rollout's shared prefill
            text = generate(client, chats("colour?", "a longer question?"), n=n, max_new_tokens=6, seed=7).data
            lengths = text.batch["response_mask"]
            assert kl_to_actor(text.batch["rollout_logprobs"], actor.logprobs(text), lengths) < PARITY
        out.batch["advantages"] = mask * torch.tensor([1.0, -1.0] * 3)[:, None]
        assert actor.update(1, "ppo", out, old_logprobs_key="").metrics["actor/grad_norm"] > 0
    finally:
        actor.stop()
