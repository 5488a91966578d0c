"""The GPU lane for vision-language models (scripts/test_gpu.sh; skipped without CUDA): a tiny Qwen2-VL on
the device in bf16.

- where torchvision is present (GPU hosts usually have it; the CPU suite's torch has none), meshrl's
  reading of a prompt with pictures (the image processor alone, its image tokens expanded here) gives the
  ids and pixels transformers' whole Qwen2VLProcessor gives;
- the actor's packed passes with pictures, through flash-attention's varlen kernel, give the padded passes'
  log-probs, with and without shared prompts;
- the hf rollout's log-probs of a generation from pictures equal the actor's packed pass on them.
"""

import io

import pytest
import torch
from PIL import Image

from meshrl.layout import rollout_tensors
from meshrl.modalities import vision
from meshrl.tiny.models import TinyModelConfig, make_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
BF16 = 2e-2  # bf16 log-probs of a 3M model: the text lane's packed-against-padded bar is of this order


def png(colour, size=(56, 56)) -> bytes:
    img = Image.new("RGB", size, (250, 250, 250))
    img.paste(colour, (6, 10, size[0] - 12, size[1] - 6))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


PICTURES = [[png((200, 30, 30))], [png((30, 30, 200), (84, 56))], [png((30, 160, 40)), png((220, 200, 30))]]
QUESTIONS = ["<image>what colour?", "<image>which shape?", "<image> and <image>?"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("vl") / "m", TinyModelConfig(family="qwen2_vl"))


def prompts(folder):
    """Each question's ids, with its pictures' tokens expanded, as the orchestrator's reader makes them."""
    from transformers import AutoTokenizer

    from meshrl.chat import render

    tokenizer, processor = AutoTokenizer.from_pretrained(folder), vision.Processor(str(folder))
    out = []
    for q, pics in zip(QUESTIONS, PICTURES):
        messages, _ = vision.with_image_parts([{"role": "user", "content": q}], "row")
        ids = tokenizer(render(tokenizer, messages, "row"), add_special_tokens=False)["input_ids"]
        out.append(processor.tokens.expand(ids, processor(pics, "row")[1], "row"))
    return out


def test_meshrl_reads_pictures_as_transformers_whole_processor_does(folder):
    pytest.importorskip("torchvision")
    from transformers import AutoTokenizer, Qwen2VLProcessor

    from meshrl.chat import render

    tokenizer = AutoTokenizer.from_pretrained(folder)
    whole = Qwen2VLProcessor.from_pretrained(folder)
    processor = vision.Processor(str(folder))
    for q, pics, ids in zip(QUESTIONS, PICTURES, prompts(folder)):
        messages, _ = vision.with_image_parts([{"role": "user", "content": q}], "row")
        text = render(tokenizer, messages, "row")
        images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pics]
        theirs = whole(text=[text], images=images, return_tensors="pt")
        pixels, grid = processor(pics, "row")
        assert theirs["input_ids"][0].tolist() == ids
        assert torch.equal(theirs["image_grid_thw"], grid)
        assert torch.allclose(theirs["pixel_values"], pixels, atol=1e-5)


@torch.no_grad()
def test_packed_passes_with_pictures_give_the_padded_ones_and_the_rollouts_log_probs(folder):
    from transformers import AutoModelForImageTextToText

    from meshrl.config.rollout import RolloutConfig
    from services.actor import model as actor_model
    from services.actor import packing
    from services.rollout.backend_hf import HFBackend
    from services.rollout.sampling import Sampling

    ids = prompts(folder)
    backend = HFBackend(RolloutConfig(model=str(folder), backend="hf", dtype="bfloat16", max_model_len=128))
    assert backend.device.type == "cuda"
    sampling = Sampling(
        n=2, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=8, stop=[], stop_token_ids=[], seed=3, logprobs=True
    )
    done = backend.generate(ids, sampling, media={"images": PICTURES})
    rows = [(p, c) for p, cs in zip(ids, done) for c in cs]
    tensors = rollout_tensors([p for p, _ in rows], [c.token_ids for _, c in rows], 0)
    rollout = torch.tensor([c.logprobs + [0.0] * (tensors["responses"].shape[1] - len(c.logprobs)) for _, c in rows])
    processor = vision.Processor(str(folder))
    micro = {k: v.cuda() for k, v in {**tensors, **processor.rows([p for p in PICTURES for _ in range(2)])}.items()}
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    mask = micro["response_mask"].bool()

    def logprobs(**kw):
        out = actor_model.forward_response(model, micro, **kw)
        return actor_model.token_logprobs(out.float(), micro["responses"])

    padded = logprobs()
    packing.enable(model)
    packed, shared = logprobs(), logprobs(share_prompts=True)
    gaps = {
        "packed": (packed - padded)[mask].abs().mean().item(),
        "packed, shared prompts": (shared - padded)[mask].abs().mean().item(),
        "rollout": (packed.cpu() - rollout)[mask.cpu()].abs().mean().item(),
        "rollout against padded": (padded.cpu() - rollout)[mask.cpu()].abs().mean().item(),
        "shared against packed": (shared - packed)[mask].abs().mean().item(),
    }
    print("mean |log-prob gap| against the padded pass (the rollout: against the packed one):", gaps)
    assert all(gap < BF16 for gap in gaps.values()), gaps
