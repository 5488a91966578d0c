"""Pictures in prompts (the PICTURES modality): reading them from data rows, and turning them into what a
vision-language model takes.

A row's images travel as their encoded bytes (PNG or JPEG) in a non-tensor column, `images`, one list per
row in the order the prompt refers to them; the prompt's messages hold a `{"type": "image"}` content part
where each goes. Every service that runs the model (the rollout, the actor, the ref) decodes them and runs
the model's own image processor, which is deterministic, so the pixels never cross the wire: a 56x56 PNG
is a few hundred bytes, its pixel patches (16 x 1176 fp32) 75 KB (bench/vision_bench.py).

Data may say where images go in any of the shapes our users' data has:
- verl's: `<image>` in a message's text, the pictures in the row's `images` column ({"bytes", "path"}
  structs as HF `datasets` writes them, raw bytes, or file paths);
- TRL's: `{"type": "image"}` content parts, the pictures in `images`;
- OpenAI's: `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}` parts (a data URL or
  a local path; the picture inside the message).

The model side follows the Qwen2-VL family's scheme (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the chat template
writes one image token per picture, which becomes (grid_t x grid_h x grid_w) / merge_size**2 of them, one
per merged patch. The image processor alone is used, not transformers' whole processor: the processor
also builds a video processor, which needs torchvision, and no torchvision runs beside the CPU torch this
project pins.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import math
import pathlib
from collections.abc import Sequence

import torch

from meshrl.modalities.base import MediaError

IMAGE = {"type": "image"}  # the content part a picture becomes: the templates of the VL families render it
PLACEHOLDER = "<image>"  # verl's mark in a message's text
IMAGE_PARTS = ("image", "image_url", "input_image")
FACTOR = 28  # patch 14 x merge 2: the Qwen2-VL family's side unit; data.max_pixels resizes in steps of it


class ImageError(MediaError):
    """A row's image that cannot be read or decoded (the message names the row)."""


def image_bytes(value, where: str, base: pathlib.Path | None = None) -> bytes:
    """One picture's encoded bytes from any form data holds it in: bytes, a {"bytes", "path"} struct, a
    data URL, a file path (relative to `base`) or a file:// URL."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dict):
        if value.get("bytes"):
            return bytes(value["bytes"])
        if value.get("path"):
            return image_bytes(value["path"], where, base)
        if isinstance(value.get("url"), str):  # an image_url part's inner mapping
            return image_bytes(value["url"], where, base)
        raise ImageError(
            f"{where}: an image is bytes, a path or a {{'bytes', 'path'}} mapping, got keys {sorted(value)}"
        )
    if not isinstance(value, str) or not value:
        raise ImageError(f"{where}: an image is bytes, a path or a data URL, got {type(value).__name__}")
    if value.startswith("data:"):
        head, _, body = value.partition(",")
        if ";base64" not in head:
            raise ImageError(f"{where}: a data URL's image must be base64 ({head[:40]!r})")
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ImageError(f"{where}: the data URL is not base64 ({e})") from None
    if value.startswith(("http://", "https://")):
        raise ImageError(f"{where}: images are not downloaded ({value[:60]}); save them with the data or as files")
    path = pathlib.Path(value.removeprefix("file://"))
    if not path.is_absolute() and base is not None:
        path = base / path
    try:
        return path.read_bytes()
    except OSError as e:
        raise ImageError(f"{where}: image {value[:80]!r} cannot be read ({e.strerror})") from None


def decode(data: bytes, where: str):
    """The picture as an RGB PIL image; ImageError naming `where` when it is not one PIL can read."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise ImageError(f"{where}: an image cannot be decoded ({type(e).__name__}: {e})") from None


def within(width: int, height: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) in steps of FACTOR, the aspect kept, with width x height within the limits (Qwen2-VL's
    smart resize, so the model's processor leaves a picture this size as it is)."""
    w, h = max(FACTOR, round(width / FACTOR) * FACTOR), max(FACTOR, round(height / FACTOR) * FACTOR)
    if max_pixels and w * h > max_pixels:
        scale = math.sqrt(width * height / max_pixels)
        w = max(FACTOR, math.floor(width / scale / FACTOR) * FACTOR)
        h = max(FACTOR, math.floor(height / scale / FACTOR) * FACTOR)
    elif min_pixels and w * h < min_pixels:
        scale = math.sqrt(min_pixels / (width * height))
        w, h = math.ceil(width * scale / FACTOR) * FACTOR, math.ceil(height * scale / FACTOR) * FACTOR
    return w, h


def sized(data: bytes, where: str, min_pixels: int, max_pixels: int) -> bytes:
    """The picture checked (it decodes) and, when its size is not one the limits keep, resized and saved as
    PNG (lossless); as it was otherwise, bytes for bytes."""
    img = decode(data, where)
    size = within(img.size[0], img.size[1], min_pixels, max_pixels)
    if size == img.size:
        return data
    out = io.BytesIO()
    img.resize(size, resample=3).save(out, format="PNG")  # 3: bicubic, as Qwen2-VL's processor resizes
    return out.getvalue()


def with_image_parts(messages: list[dict], where: str) -> tuple[list[dict], list]:
    """The messages with every picture as an IMAGE part, and the pictures the parts held themselves (an
    OpenAI image_url part's URL; None for a part that points at the row's `images` column), in order.
    verl's `<image>` marks in text become IMAGE parts in place."""
    out: list[dict] = []
    inline: list = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and PLACEHOLDER in content:
            parts: list = []
            for k, text in enumerate(content.split(PLACEHOLDER)):
                parts += ([IMAGE] if k else []) + ([{"type": "text", "text": text}] if text else [])
                inline += [None] if k else []
            content = parts
        elif isinstance(content, list):
            parts = []
            for p in content:
                kind = p.get("type") if isinstance(p, dict) else None
                if kind is None and isinstance(p, dict):
                    kind = next((k for k in IMAGE_PARTS if k in p), None)
                if kind in IMAGE_PARTS:
                    # OpenAI's Responses API writes {"type": "input_image", "image_url": "data:..."}
                    held = p.get(kind) or p.get("image_url") or p.get("image")
                    inline.append(held if isinstance(held, (str, dict, bytes)) and held else None)
                    parts.append(IMAGE)
                else:
                    parts.append(p)
            content = parts
        out.append({**m, "content": content} if content is not m.get("content") else m)
    return out, inline


def row_images(
    messages: list[dict], column, where: str, base: pathlib.Path | None = None
) -> tuple[list[dict], list[bytes]]:
    """A row's messages with IMAGE parts, and its pictures' bytes in order: each part's own, or the next of
    the `images` column's. A count that does not match is refused, naming the row."""
    messages, inline = with_image_parts(messages, where)
    listed = [] if column is None else list(column) if isinstance(column, (list, tuple)) else [column]
    wanted = sum(1 for x in inline if x is None)
    if wanted != len(listed):
        raise ImageError(
            f"{where}: the prompt has {wanted} image place(s) (<image> or image parts) but the row's images "
            f"column holds {len(listed)} picture(s)"
        )
    column_pictures = iter(listed)
    pictures = []
    for k, held in enumerate(inline):
        value = held if held is not None else next(column_pictures)
        pictures.append(image_bytes(value, f"{where} image {k}", base))
    return messages, pictures


@dataclasses.dataclass
class Tokens:
    """A vision-language model's image token and how many each picture becomes."""

    image: int  # the id the template writes once per picture, repeated to the picture's merged patches
    merge: int  # merge_size: merged patches are merge x merge patches

    def count(self, grid: torch.Tensor) -> int:
        """Image tokens of one picture's (t, h, w) patch grid."""
        return int(grid.prod()) // self.merge**2

    def check(self, ids: Sequence[int] | torch.Tensor, grids: torch.Tensor, where: str) -> None:
        """ids hold one image token per merged patch of the pictures (the model's forward fails obscurely
        otherwise): the data and the pictures that came with it agree."""
        have = int((torch.as_tensor(ids) == self.image).sum())
        want = sum(self.count(g) for g in grids)
        if have != want:
            raise ImageError(
                f"{where}: the prompt holds {have} image tokens where its {len(grids)} picture(s) make {want} "
                "(the prompt's ids were made for other pictures, or another image processor)"
            )

    def blind(self, prompts: Sequence[Sequence[int]] | torch.Tensor) -> None:
        """Refuse prompts holding image tokens in a batch that carries no pictures: the model would read the
        tokens' own embeddings in their place, silently."""
        row = next((i for i, p in enumerate(prompts) if bool((torch.as_tensor(p) == self.image).any())), None)
        if row is not None:
            raise ImageError(
                f"row {row} holds image tokens, but the batch carries no pictures (an `images` column of "
                "encoded pictures): the model would read the tokens' own embeddings in their place"
            )

    def expand(self, ids: Sequence[int], grids: torch.Tensor, where: str) -> list[int]:
        """ids with the k-th image token repeated for the k-th picture's merged patches."""
        places = [i for i, t in enumerate(ids) if t == self.image]
        if len(places) != len(grids):
            raise ImageError(
                f"{where}: the prompt holds {len(places)} image token(s) after the chat template, for "
                f"{len(grids)} picture(s) (does the template render image parts?)"
            )
        out: list[int] = []
        last = 0
        for place, grid in zip(places, grids):
            out += list(ids[last:place]) + [self.image] * self.count(grid)
            last = place + 1
        return out + list(ids[last:])


def is_vision(config) -> bool:
    """A vision-language model's config (its own, or config.json's dict)."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    return get("vision_config") is not None


class Processor:
    """A model folder's image processor and image token: pictures' bytes in, what the model's forward takes
    out (pixel_values: (patches, channels x temporal x patch x patch); image_grid_thw: (pictures, 3))."""

    def __init__(self, model: str, pixels: tuple[int, int] = (0, 0)):
        """pixels: (data.min_pixels, data.max_pixels), what data's pictures are resized to (fit)."""
        import transformers

        config = transformers.AutoConfig.from_pretrained(model)
        if not is_vision(config) or getattr(config, "image_token_id", None) is None:
            raise ValueError(f"{model} is not a vision-language model of the Qwen2-VL family (no image_token_id)")
        self.images = transformers.AutoImageProcessor.from_pretrained(model)
        self.tokens = Tokens(int(config.image_token_id), int(getattr(self.images, "merge_size", 2)))
        self.pixels = pixels

    def __call__(self, pictures: Sequence[bytes], where: str) -> tuple[torch.Tensor, torch.Tensor]:
        imgs = [decode(p, f"{where} image {k}") for k, p in enumerate(pictures)]
        out = self.images(images=imgs, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def each(self, images: Sequence, where: str = "row") -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Each row's (pixel_values, grid), None for a row without pictures. Rows with the same pictures (a
        GRPO group's n samples) are processed once: decoding and the processor are most of what pictures
        cost a call here."""
        made: dict[tuple[bytes, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        out: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for i, p in enumerate(images):
            key = tuple(p or ())
            if key and key not in made:
                made[key] = self(list(key), f"{where} {i}")
            out.append(made.get(key))
        return out

    def rows(self, images: Sequence, where: str = "row") -> dict[str, torch.Tensor]:
        """A batch's pictures as two per-row tensors beside input_ids (what DataProto's operations split and
        select with the rows): pixel_values (rows, most patches, D) and image_grid_thw (rows, most pictures, 3),
        zero past each row's own (a zero grid is no picture)."""
        return stack(self.each(images, where))

    def fit(self, items: list[bytes], ids: list[int], where: str) -> tuple[list[bytes], list[int]]:
        """A data row's pictures at the size data.min_pixels/max_pixels allow, and its ids with each image
        token repeated for its picture's merged patches, as this image processor makes them."""
        items = [sized(p, f"{where} image {k}", *self.pixels) for k, p in enumerate(items)]
        _, grids = self(items, where)
        return items, self.tokens.expand(ids, grids, where)

    def batch(self, column: Sequence, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The actor's row tensors (stack) for a batch's `images` column, each row's prompt ids checked to
        hold one image token per merged patch of its pictures."""
        done = self.each(column)
        for i, d in enumerate(done):
            self.tokens.check(ids[i], d[1] if d else torch.zeros(0, 3), f"row {i}")
        return stack(done)

    def generate_inputs(self, prompts: list[list[int]], column: Sequence, n: int) -> dict[str, torch.Tensor]:
        """generate's pixel_values and image_grid_thw for the prompts with pictures, each repeated for its n
        samples, each prompt checked against its pictures."""
        pixels, grids = [], []
        for i, (p, pics) in enumerate(zip(prompts, column)):
            if pics:
                x, g = self(list(pics), f"row {i}")
                self.tokens.check(p, g, f"row {i}")
                pixels += [x] * n
                grids += [g] * n
        return {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.cat(grids)}

    def along(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Which tokens are image tokens: Qwen2-VL's generate reads them for its three-axis positions."""
        return {"mm_token_type_ids": (ids == self.tokens.image).int()}


def stack(done: Sequence[tuple[torch.Tensor, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """Per-row (pixel_values, grid) pairs (None: no picture) as the row tensors Processor.rows makes, and
    picture_set: each row's pictures as an index into the distinct ones (-1: none; rows given the same pair
    object, as Processor.each gives rows with the same pictures, are the same), so telling prompts apart
    costs no comparison of pixels."""
    real = [d for d in done if d is not None]
    width = real[0][0].shape[1] if real else 0
    patches = max((len(d[0]) for d in real), default=0)
    pictures = max((len(d[1]) for d in real), default=0)
    pixels = torch.zeros(len(done), patches, width, dtype=real[0][0].dtype if real else torch.float32)
    grids = torch.zeros(len(done), pictures, 3, dtype=torch.int64)
    sets: dict[int, int] = {}
    index = torch.full((len(done),), -1, dtype=torch.int64)
    for i, d in enumerate(done):
        if d is not None:
            pixels[i, : len(d[0])], grids[i, : len(d[1])] = d[0], d[1]
            index[i] = sets.setdefault(id(d), len(sets))
    return {"pixel_values": pixels, "image_grid_thw": grids, "picture_set": index}


def unstack(pixels: torch.Tensor, grids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' pictures in row order, as the model's forward takes them: (all patches, D), (pictures, 3)."""
    real = grids.prod(-1) > 0  # (rows, most pictures)
    counts = (grids.prod(-1) * real).sum(1)  # each row's patches
    keep = torch.arange(pixels.shape[1], device=pixels.device)[None] < counts[:, None]
    return pixels[keep], grids[real]


ROW_TENSORS = ("pixel_values", "image_grid_thw", "picture_set")  # per row, not per token: never cut with the sequence


class Pictures:
    """The pictures modality (meshrl/modalities/base.Modality): what it declares, for every service."""

    name = "pictures"
    column = "images"  # the batch's column of each row's pictures, encoded
    row_tensors: tuple[str, ...] = ROW_TENSORS
    parts: tuple[str, ...] = IMAGE_PARTS

    def read(self, messages: list[dict], value, where: str, base: pathlib.Path | None):
        return row_images(messages, value, where, base)

    def takes(self, config: dict) -> bool:
        return is_vision(config)

    def blind(self, config: dict, prompts) -> None:
        image = config.get("image_token_id") if is_vision(config) else None
        if image is not None:
            Tokens(int(image), 1).blind(prompts)

    def reader(self, model: str, options: dict) -> Processor:
        return Processor(model, options.get("pixels", (0, 0)))

    def options(self, data) -> dict:
        """data.image_key names the files' column; data.min_pixels/max_pixels size the pictures."""
        return {"key": data.image_key, "pixels": (data.min_pixels, data.max_pixels)}

    def refuses(self, cfg, roles: set[str]) -> str:
        """What a run whose data holds pictures cannot do yet: vLLM (meshrl passes pictures to transformers'
        generate only), sequence parallelism, episodes and partial rollouts, a critic."""
        sampled = "rollout" in roles
        if sampled and cfg.rollout.backend != "hf":
            return "set rollout.backend=hf (meshrl does not pass pictures to vLLM yet)"
        if cfg.actor.sequence_parallel > 1:
            return "actor.sequence_parallel does not take them yet (set it to 1)"
        if sampled and (cfg.rollout.episodes or cfg.rollout.partial):
            what = "partial rollouts (rollout.partial)" if cfg.rollout.partial else "multi-turn episodes and agents"
            return f"{what} do not carry them yet; sample single turns"
        if "critic" in roles:
            return "a critic (value model) does not take them yet; use grpo or rloo"
        return ""


PICTURES = Pictures()
