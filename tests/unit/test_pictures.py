"""Pictures in data (meshrl/modalities/vision.py, orchestrator/data.py): verl's, TRL's and OpenAI's shapes read into the
same rows from every file kind, sizes kept to data.min_pixels/max_pixels, bad pictures refused in one line
naming the row, image tokens expanded to the processor's patches, and the per-row tensors and the bytes
column surviving the wire."""

import base64
import io
import json

import pandas as pd
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer

from meshrl.codec import decode_dataproto, encode_dataproto
from meshrl.modalities import vision
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.data import PromptDataset

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}


def png(size=(56, 56), colour=(200, 20, 20), fmt="PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format=fmt)
    return out.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("vl") / "m", TinyModelConfig(family="qwen2_vl", **SMALL))


@pytest.fixture(scope="module")
def image(folder):
    """The tiny model's image token (<|image_pad|>)."""
    return json.loads((folder / "config.json").read_text())["image_token_id"]


@pytest.fixture(scope="module")
def tokenizer(folder):
    return AutoTokenizer.from_pretrained(folder)


def read(path, tokenizer, folder, **kw):
    return PromptDataset(str(path), tokenizer, 300, model=str(folder), **kw)


def test_verl_trl_and_openai_shapes_read_into_the_same_rows(tmp_path, tokenizer, folder, image):
    picture = png()
    (tmp_path / "pic.png").write_bytes(picture)
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    shapes = {
        "verl": {"prompt": [{"role": "user", "content": "<image>What colour?"}], "images": [{"bytes": picture}]},
        "trl": {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}],
            "images": [picture],
        },
        "openai": {
            "prompt": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": "What colour?"},
                    ],
                }
            ]
        },
        "path": {"prompt": [{"role": "user", "content": "<image>What colour?"}], "images": ["pic.png"]},
        "responses api": {  # OpenAI's Responses API: input_image parts with the URL beside the type
            "prompt": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": url}, {"type": "text", "text": "What colour?"}],
                }
            ]
        },
        "file url": {
            "prompt": [{"role": "user", "content": "<image>What colour?"}],
            "images": [f"file://{tmp_path}/pic.png"],
        },
    }
    got = {}
    for name, row in shapes.items():
        for kind in ("parquet", "jsonl"):
            if kind == "jsonl" and any(isinstance(p, (bytes, dict)) for p in row.get("images", [])):
                continue  # JSON holds no bytes: JSON lines data names files or data URLs
            path = tmp_path / f"{name.replace(' ', '_')}.{kind}"
            frame = pd.DataFrame([row])
            frame.to_parquet(path) if kind == "parquet" else frame.to_json(path, orient="records", lines=True)
            data = read(path, tokenizer, folder)
            got[name, kind] = (data.prompt_ids[0], data.rows[0]["images"], data.rows[0]["prompt"])
    first = next(iter(got.values()))
    # the same ids and pictures (parquet gives a text part the other parts' keys as None: the same text)
    assert all(g[:2] == first[:2] for g in got.values()), {k: v[2] for k, v in got.items() if v != first}
    ids, pictures, messages = first
    assert ids.count(image) == 4 and pictures == [picture]  # 56 x 56: 4 x 4 patches, merged 2 x 2
    assert messages[0]["content"][0] == {"type": "image"}


def test_a_datasets_folder_reads_as_parquet_does(tmp_path, tokenizer, folder, image):
    import datasets

    row = {"prompt": [{"role": "user", "content": "<image>?"}], "images": [{"bytes": png(), "path": None}]}
    datasets.Dataset.from_list([row]).save_to_disk(str(tmp_path / "ds"))
    data = read(tmp_path / "ds", tokenizer, folder)
    assert data.prompt_ids[0].count(image) == 4


def test_sizes_keep_to_the_limits_and_a_picture_that_fits_is_kept_byte_for_byte(tmp_path, tokenizer, folder, image):
    jpeg, big = png(fmt="JPEG"), png((560, 280))
    rows = [{"prompt": "<image>?", "images": [{"bytes": b}]} for b in (jpeg, big)]
    pd.DataFrame(rows).to_parquet(tmp_path / "r.parquet")
    data = read(tmp_path / "r.parquet", tokenizer, folder, media={"pictures": {"pixels": (0, 56 * 112)}})
    assert data.rows[0]["images"] == [jpeg]  # 56 x 56 fits: not decoded and saved again
    small = Image.open(io.BytesIO(data.rows[1]["images"][0]))
    assert small.size == (112, 56) and small.size[0] * small.size[1] <= 56 * 112
    assert data.prompt_ids[1].count(image) == 8  # (112 / 14) x (56 / 14) / 4
    assert vision.within(30, 30, 56 * 56, 0) == (56, 56)  # scaled up to the floor, in steps of 28


@pytest.mark.parametrize(
    "row, says",
    [
        ({"prompt": "<image>?", "images": [{"bytes": b"\x89PNG broken"}]}, "row 0 image 0: an image cannot be decoded"),
        ({"prompt": "<image>?", "images": ["nowhere.png"]}, "row 0 image 0: image 'nowhere.png' cannot be read"),
        ({"prompt": "<image><image>?", "images": [{"bytes": png()}]}, "2 image place(s)"),
        ({"prompt": "?", "images": [{"bytes": png()}]}, "0 image place(s)"),
        ({"prompt": "<image>?", "images": ["https://x.org/a.png"]}, "images are not downloaded"),
        ({"prompt": "<image>?", "images": ["data:image/png,abc"]}, "must be base64"),
    ],
    ids=["undecodable", "missing", "too few", "too many", "url", "data url"],
)
def test_a_bad_picture_is_refused_in_one_line_naming_the_row(tmp_path, tokenizer, folder, row, says):
    pd.DataFrame([row]).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError) as e:
        read(tmp_path / "bad.parquet", tokenizer, folder)
    assert says in str(e.value) and "data.train_files row 0" in str(e.value) and "\n" not in str(e.value)


def test_tokens_expand_and_check_against_the_grids():
    tokens = vision.Tokens(image=9, merge=2)
    grids = torch.tensor([[1, 4, 4], [1, 2, 6]])
    ids = tokens.expand([1, 9, 2, 9, 3], grids, "row 0")
    assert ids == [1, *[9] * 4, 2, *[9] * 3, 3]
    tokens.check(ids, grids, "row 0")
    with pytest.raises(vision.ImageError, match="row 0: the prompt holds 4 image tokens where its 2 picture"):
        tokens.check(ids[:-5] + [3], grids, "row 0")
    with pytest.raises(vision.ImageError, match="holds 1 image token"):
        tokens.expand([1, 9], grids, "row 0")


def test_the_row_tensors_and_the_pictures_travel_and_come_apart_per_row(folder):
    from meshrl.dataproto import DataProto

    processor = vision.Processor(str(folder))
    pictures = [[png()], None, [png((84, 56)), png((28, 28))]]
    rows = processor.rows(pictures)
    assert rows["pixel_values"].shape[:2] == (3, 24 + 16) and rows["image_grid_thw"].shape == (3, 2, 3)
    data = DataProto({"input_ids": torch.zeros(3, 2, dtype=torch.long), **rows}, {"images": pictures})
    back = decode_dataproto(b"".join(encode_dataproto(data)))[0]
    assert back.non_tensor_batch["images"].tolist() == pictures
    pixels, grids = vision.unstack(back.batch["pixel_values"][[2, 0]], back.batch["image_grid_thw"][[2, 0]])
    direct = [processor(pictures[2], "r"), processor(pictures[0], "r")]
    assert torch.equal(pixels, torch.cat([d[0] for d in direct])) and torch.equal(
        grids, torch.cat([d[1] for d in direct])
    )
    assert json.dumps(grids.tolist()) == "[[1, 4, 6], [1, 4, 4], [1, 4, 4]]"


def test_packed_shared_and_padded_passes_agree_with_pictures(folder, image):
    """The actor's passes over a micro-batch with pictures: padded, packed, and packed with shared prompts
    (rows 0-1 share a prompt and its picture; rows 2-3 have the same ids with other pictures: two prompts)."""
    from transformers import AutoModelForImageTextToText

    from meshrl.layout import rollout_tensors
    from services.actor import model as actor_model
    from services.actor import packing

    processor = vision.Processor(str(folder))
    pictures = [[png(colour=(200, 20, 20))], [png(colour=(200, 20, 20))], [png(colour=(20, 20, 200))], [png()]]
    prompt = [5, 6, image, 7]
    _, grids = processor(pictures[0], "r")
    ids = processor.tokens.expand(prompt, grids, "r")
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(10, 100, (n,), generator=g).tolist() for n in (3, 5, 4, 2)]
    responses[1][2] = image  # a policy may sample the image token: it is a token there, not a picture
    tensors = rollout_tensors([ids, ids, [9, *ids], [9, *ids]], responses, 0)
    micro = {**tensors, **processor.rows(pictures)}
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    padded = actor_model.forward_response(model, micro)
    packing.enable(model)
    packed = actor_model.forward_response(model, micro)
    assert actor_model.prompt_sharing(micro, tensors["responses"].shape[1]) is not None  # the shared pass runs
    shared = actor_model.forward_response(model, micro, share_prompts=True)
    mask = tensors["response_mask"].bool()
    for out in (packed, shared):
        assert torch.allclose(out[mask], padded[mask], atol=1e-5)
    # row 1 as the rollout ran it: the prompt with its picture, then each response token as a token
    prompt_ids = torch.tensor([ids])
    first = model(
        input_ids=prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        mm_token_type_ids=(prompt_ids == image).int(),
        use_cache=True,
        **{k: v for k, v in zip(vision.ROW_TENSORS, processor(pictures[1], "r"))},
    )
    rest = model(input_ids=torch.tensor([responses[1][:-1]]), past_key_values=first.past_key_values, use_cache=True)
    ran = torch.cat([first.logits[:, -1:], rest.logits], 1)[0]
    assert torch.allclose(padded[1, :5], ran, atol=1e-4)
    other = {**micro, **processor.rows([pictures[2], *pictures[1:]])}  # row 0 sees another picture
    assert not torch.allclose(actor_model.forward_response(model, other, share_prompts=True)[0], shared[0], atol=1e-4)


def test_a_run_with_pictures_is_refused_in_one_line_where_they_cannot_go():
    from types import SimpleNamespace

    from meshrl.modalities import check as check_pictures
    from orchestrator.config import load_config

    sets = [SimpleNamespace(key="data.train_files", rows=[{"prompt": []}, {"prompt": [], "images": [b""]}])]
    with pytest.raises(ValueError, match="data.train_files holds pictures: set rollout.backend=hf"):
        check_pictures(load_config(None, ["rollout.backend=vllm"]), {"actor", "rollout"}, sets)
    check_pictures(load_config(None, ["rollout.backend=vllm"]), {"actor"}, sets)  # SFT: no rollout
    check_pictures(load_config(None, ["rollout.backend=hf"]), {"actor", "rollout"}, sets)
    with pytest.raises(ValueError, match="actor.sequence_parallel does not take them yet"):
        check_pictures(load_config(None, ["actor.sequence_parallel=2"]), {"actor"}, sets)
    check_pictures(load_config(None, ["rollout.backend=vllm"]), {"rollout"}, [SimpleNamespace(key="k", rows=[{}])])
    hf = ["rollout.backend=hf"]
    with pytest.raises(ValueError, match="multi-turn episodes and agents do not carry them yet"):
        check_pictures(load_config(None, [*hf, "rollout.multi_turn=true"]), {"actor", "rollout"}, sets)
    with pytest.raises(ValueError, match="partial rollouts"):
        check_pictures(load_config(None, [*hf, "rollout.partial=true"]), {"actor", "rollout"}, sets)
    with pytest.raises(ValueError, match="a critic"):
        check_pictures(load_config(None, hf), {"actor", "rollout", "critic"}, sets)


def test_data_image_key_names_the_pictures_column(tmp_path, tokenizer, folder, image):
    pd.DataFrame([{"prompt": "<image>?", "pics": [{"bytes": png()}]}]).to_parquet(tmp_path / "r.parquet")
    data = read(tmp_path / "r.parquet", tokenizer, folder, media={"pictures": {"key": "pics"}})
    assert data.prompt_ids[0].count(image) == 4 and len(data.rows[0]["images"]) == 1
