"""Whether two models read token ids the same way: a tokenizer's fingerprint (its vocabulary: every token's
text and id) and how two differ. On-policy distillation compares a teacher's log-probs with the student's
token by token, which means nothing across vocabularies; the run checks this first. Special tokens may
differ (a base student and an instruct teacher of one family end on different tokens): that is said, not
refused."""

import functools
import hashlib
import json

SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary: every token's text and id."""
    text = json.dumps(tokenizer.get_vocab(), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def folder_tokenizer(path: str):
    from transformers import AutoTokenizer  # with the first folder read, not with this module

    return AutoTokenizer.from_pretrained(path)


def difference(a, b) -> str:
    """How tokenizer b's vocabulary differs from a's, in a few words ("" where they agree)."""
    va, vb = a.get_vocab(), b.get_vocab()
    if va == vb:
        return ""
    if len(va) != len(vb):
        return f"{len(va)} tokens against {len(vb)}"
    token = next(t for t in sorted(va) if vb.get(t) != va[t])
    return f"token {token!r} is id {va[token]} against {vb.get(token)}"


def special_difference(a, b) -> str:
    """The special tokens' ids that differ between a and b ("" where none do)."""
    return ", ".join(
        f"{k} {getattr(a, k, None)} against {getattr(b, k, None)}"
        for k in SPECIAL
        if getattr(a, k, None) != getattr(b, k, None)
    )


@functools.cache
def model_vocab_size(path: str) -> int:
    """How many token ids the model in folder `path` takes (its config's vocab_size, a vision-language
    model's text config's; embeddings are often padded past the tokenizer's length)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    return int(config.get_text_config().vocab_size)
