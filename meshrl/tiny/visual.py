"""The bundled visual task: name the colour and the kind of a shape drawn on a picture, written as parquet in
verl's multimodal schema, seeded.

Each picture (56 x 56 PNG, drawn with PIL) holds one shape (a square, a circle or a triangle) of one of six
colours, at a random place and size, on a light background with a little noise. Each row: `prompt` =
[{"role": "user", "content": "<image>What shape is this?"}] (verl's `<image>` mark), `images` = [{"bytes":
PNG, "path": None}] (the struct HF `datasets` writes), `data_source` = "visual", `reward_model` =
{"style": "rule", "ground_truth": "red circle"}, `extra_info` = {"split", "index", "answer"} (the answer
serves SFT). Test pictures are drawn from a stream of their own, so none is a train picture.
"""

import dataclasses
import io
import pathlib
import random

DATA_SOURCE = "visual"
COLOURS = {
    "red": (210, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 70, 210),
    "yellow": (220, 200, 40),
    "purple": (140, 50, 170),
    "orange": (235, 130, 30),
}
SHAPES = ("square", "circle", "triangle")
QUESTION = "<image>What shape is this?"
SIZE = 56  # 4 x 4 patches of 14: 4 image tokens after the 2 x 2 merge


@dataclasses.dataclass
class VisualConfig:
    num_train: int = 2000  # rows of train.parquet
    num_test: int = 300  # rows of test.parquet
    seed: int = 0  # which pictures are drawn


def draw(colour: str, shape: str, rng: random.Random) -> bytes:
    """One picture as PNG bytes."""
    from PIL import Image, ImageDraw

    shade = rng.randint(215, 250)
    img = Image.new("RGB", (SIZE, SIZE), (shade, shade, shade))
    pen = ImageDraw.Draw(img)
    for _ in range(20):  # specks: no two pictures of a kind alike
        x, y = rng.randrange(SIZE), rng.randrange(SIZE)
        grey = rng.randint(170, 255)
        pen.point((x, y), (grey, grey, grey))
    side = rng.randint(24, 40)
    x, y = rng.randint(2, SIZE - side - 2), rng.randint(2, SIZE - side - 2)
    box = (x, y, x + side, y + side)
    fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    if shape == "square":
        pen.rectangle(box, fill=fill)
    elif shape == "circle":
        pen.ellipse(box, fill=fill)
    else:
        pen.polygon([(x, y + side), (x + side, y + side), (x + side // 2, y)], fill=fill)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def rows(count: int, split: str, rng: random.Random) -> list[dict]:
    out = []
    for index in range(count):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        answer = f"{colour} {shape}"
        out.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": QUESTION}],
                "images": [{"bytes": draw(colour, shape, rng), "path": None}],
                "ability": "vision",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "answer": answer},
            }
        )
    return out


def make_data(out_dir: str | pathlib.Path, cfg: VisualConfig = VisualConfig()) -> dict[str, pathlib.Path]:
    import pandas as pd

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, count, stream in (("train", cfg.num_train, 0), ("test", cfg.num_test, 1)):
        paths[split] = out / f"{split}.parquet"
        pd.DataFrame(rows(count, split, random.Random(cfg.seed * 1000 + stream))).to_parquet(paths[split])
    return paths


def corpus() -> list[str]:
    """The task's words, for the tiny BPE tokenizer (make-model --family qwen2_vl learns merges for them)."""
    return [QUESTION.removeprefix("<image>"), *(f"{c} {s}" for c in COLOURS for s in SHAPES)]
