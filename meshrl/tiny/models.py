"""Tiny HuggingFace model folders for tests and the default run, built locally and seeded.

`causal`: a Llama-style causal LM (~3.2M parameters at the defaults, untied
embeddings by default; --tie-word-embeddings shares the input embedding with the
output head, as Qwen2.5-0.5B, GPT-2 and many small checkpoints do). `reward`: the same
body with a one-logit sequence-classification head, for reward-model tests.
"""

import dataclasses
import pathlib

KINDS = ("causal", "reward")


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


def make_model(out_dir: str | pathlib.Path, cfg: TinyModelConfig = TinyModelConfig()) -> pathlib.Path:
    """Write a model folder (config, safetensors, tokenizer) that from_pretrained and vLLM can load."""
    import torch  # here, not at the top: `meshrl --help` reads TinyModelConfig without torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from meshrl.tiny.tokenizer import save_tokenizer

    if cfg.kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {cfg.kind!r}")
    if cfg.hidden_size % cfg.num_heads or cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"hidden_size {cfg.hidden_size} must divide into num_heads {cfg.num_heads}, "
            f"and num_heads into num_kv_heads {cfg.num_kv_heads}"
        )
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = save_tokenizer(out)
    vocab = -(-len(tok) // cfg.vocab_multiple) * cfg.vocab_multiple
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=cfg.tie_word_embeddings,
        num_labels=1,  # type: ignore[call-arg]  # PreTrainedConfig takes it; LlamaConfig's signature does not list it
        dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    cls = LlamaForCausalLM if cfg.kind == "causal" else LlamaForSequenceClassification
    model = cls(config)
    if model.can_generate():
        model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out))
    return out


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
