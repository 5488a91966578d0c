"""Whether two models read token ids the same way: a tokenizer's fingerprint (its vocabulary and special
tokens) and the one-line difference between two. On-policy distillation compares a teacher's log-probs
with the student's token by token, which means nothing across tokenizers; the run checks this first."""

import functools
import hashlib
import json

SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def identity(tokenizer) -> dict:
    return {"vocab": tokenizer.get_vocab(), **{k: getattr(tokenizer, k, None) for k in SPECIAL}}


def fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary (every token's text and id) and the special tokens' ids."""
    text = json.dumps(identity(tokenizer), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def folder_tokenizer(path: str):
    from transformers import AutoTokenizer  # with the first folder read, not with this module

    return AutoTokenizer.from_pretrained(path)


def difference(a, b) -> str:
    """How tokenizer b differs from a, in a few words ("" where they agree)."""
    ia, ib = identity(a), identity(b)
    if ia["vocab"] != ib["vocab"]:
        va, vb = ia["vocab"], ib["vocab"]
        if len(va) != len(vb):
            return f"{len(va)} tokens against {len(vb)}"
        token = next(t for t in sorted(va) if vb.get(t) != va[t])
        return f"token {token!r} is id {va[token]} against {vb.get(token)}"
    for key in SPECIAL:
        if ia[key] != ib[key]:
            return f"{key} {ia[key]} against {ib[key]}"
    return ""
