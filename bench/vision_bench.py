"""What pictures cost: bytes on the wire per sample, a GRPO step against a text-only one of the same language
model, and the vision tower's share of an update.

    .venv/bin/python bench/vision_bench.py [--steps 8]

1. Wire: one row's pictures as meshrl sends them (encoded bytes in the `images` column) against the pixel
   patches the image processor makes of them (pixel_values fp32 + image_grid_thw), each as the DataProto
   codec writes it: the visual task's 56 x 56 PNG, and a 448 x 448 photo-like JPEG (noise over a gradient).
2. Step: the visual task through the mesh (configs/visual_grpo.yaml: hf rollout, one actor rank) against the
   same run with each picture's place in the prompt taken by six digits, distinct per row (the same prompt
   lengths and as many distinct prompts, text only, the same tiny Qwen2-VL): the mean of each phase over the
   steps after the first (timing_s/*).
3. Tower: one micro-batch's update pass (forward and backward, the task's 256 samples) with the tower
   trained, and the tower's own forward and backward on its pictures, timed alone.
"""

import argparse
import io
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from meshrl import vision  # noqa: E402
from meshrl.codec import encode_dataproto  # noqa: E402
from meshrl.dataproto import DataProto  # noqa: E402
from meshrl.tiny.models import TinyModelConfig, make_model  # noqa: E402
from meshrl.tiny.visual import VisualConfig, make_data  # noqa: E402
from testkit.recipe import timed_grpo  # noqa: E402

PHASES = ("gen", "reward", "adv", "update_actor", "update_weights")


def wire_bytes(data: DataProto) -> int:
    return sum(len(memoryview(b).cast("B")) for b in encode_dataproto(data))


def photo() -> bytes:
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    ramp = torch.linspace(0, 200, 448)[None, :, None].expand(448, 448, 3)
    pixels = (ramp + torch.randint(0, 56, (448, 448, 3), generator=g)).clamp(0, 255).to(torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, format="JPEG", quality=90)
    return out.getvalue()


def wire(model: pathlib.Path, data: dict) -> None:
    processor = vision.Processor(str(model))
    task = pd.read_parquet(data["train"]).images[0][0]["bytes"]
    print("| picture | encoded (sent) | pixel patches | ratio |\n|---|---|---|---|")
    for name, picture in (("visual task, 56 x 56 PNG", task), ("448 x 448 JPEG", photo())):
        sent = wire_bytes(DataProto(non_tensor_batch={"images": [[picture]]}))
        pixels = wire_bytes(DataProto(processor.rows([[picture]])))
        print(f"| {name} | {sent:,} B | {pixels:,} B | {pixels / sent:.0f}x |", flush=True)


def steps(work: pathlib.Path, model: pathlib.Path, data: dict, count: int) -> None:
    from transformers import AutoTokenizer

    from orchestrator.data import PromptDataset

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = pd.read_parquet(data["train"])
    text = rows.drop(columns=["images"])
    # each picture's place taken by as many text tokens (six digits, one token each), distinct per row: the
    # same prompt lengths, and as many distinct prompts (identical texts would share one prompt's pass)
    text["prompt"] = [
        [{"role": "user", "content": p[0]["content"].replace("<image>", f"{i:06d}")}] for i, p in enumerate(rows.prompt)
    ]
    text.to_parquet(work / "text.parquet")
    print("\n| run | prompt tokens | step (s) | " + " | ".join(PHASES) + " |")
    print("|---|---|---|" + "---|" * len(PHASES))
    for name, train in (("with pictures", data["train"]), ("text only", work / "text.parquet")):
        got = timed_grpo("visual", work / name.replace(" ", "_"), model, train, count, "reward.workers=1")
        mean = {k: statistics.mean(r.get(f"timing_s/{k}", 0.0) for r in got) for k in ("step", *PHASES)}
        prompt = statistics.mean(map(len, PromptDataset(str(train), tokenizer, 200, model=str(model)).prompt_ids))
        phases = " | ".join(f"{mean[k]:.3f}" for k in PHASES)
        print(f"| {name} | {prompt:.1f} | {mean['step']:.3f} | {phases} |", flush=True)


def tower(model_dir: pathlib.Path, data: dict) -> None:
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from meshrl.layout import rollout_tensors
    from orchestrator.data import PromptDataset
    from services.actor import model as actor_model
    from services.actor import packing

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ds = PromptDataset(str(data["train"]), tokenizer, 200, model=str(model_dir))
    rows = [i % 32 for i in range(256)]  # 32 prompts x 8 samples, as a step of the task
    answers = [tokenizer(ds.rows[i]["extra_info"]["answer"])["input_ids"] for i in rows]
    tensors = rollout_tensors([ds.prompt_ids[i] for i in rows], answers, tokenizer.pad_token_id)
    processor = vision.Processor(str(model_dir))
    micro = {**tensors, **processor.rows([ds.rows[i]["images"] for i in rows])}
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    packing.enable(model)
    visual = model.model.visual
    sharing = actor_model.prompt_sharing(micro, tensors["responses"].shape[1])
    assert sharing is not None
    seen = actor_model.pictures(model, micro)
    assert seen is not None
    shared = seen.only(sharing[0], micro)

    def whole() -> None:
        actor_model.forward_response(model, micro, share_prompts=True).float().logsumexp(-1).sum().backward()

    def alone() -> None:
        visual(shared.inputs["pixel_values"], grid_thw=shared.inputs["image_grid_thw"]).pooler_output.sum().backward()

    print("\n| pass | ms (median of 5) |\n|---|---|")
    passes = (("update pass, shared prompts (forward + backward)", whole), ("the tower alone, once per prompt", alone))
    for name, fn in passes:
        times = []
        for _ in range(6):
            model.zero_grad()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        print(f"| {name} | {1000 * statistics.median(times[1:]):.1f} |", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        data = make_data(work / "data", VisualConfig())
        model = make_model(work / "model", TinyModelConfig(family="qwen2_vl"))
        wire(model, data)
        steps(work, model, data, args.steps)
        tower(model, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
