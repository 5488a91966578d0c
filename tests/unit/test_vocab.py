"""A tokenizer's fingerprint and the difference between two (meshrl.vocab): what decides whether a teacher
can grade a student token by token (the vocabulary; special tokens are only said)."""

import copy

from transformers import AutoTokenizer

from meshrl.vocab import difference, fingerprint, special_difference


def test_the_same_tokenizer_agrees_and_another_says_how_it_differs(tiny_lm, bpe_lm):
    char, bpe = AutoTokenizer.from_pretrained(tiny_lm), AutoTokenizer.from_pretrained(bpe_lm)
    assert difference(char, AutoTokenizer.from_pretrained(tiny_lm)) == ""
    assert fingerprint(char) == fingerprint(AutoTokenizer.from_pretrained(tiny_lm))
    assert fingerprint(char) != fingerprint(bpe)
    assert difference(char, bpe) == f"{len(char.get_vocab())} tokens against {len(bpe.get_vocab())}"


def test_another_end_token_over_the_same_vocabulary_is_said_not_refused(tiny_lm):
    """A base student and an instruct teacher of one family: the same ids, other end tokens."""
    a = AutoTokenizer.from_pretrained(tiny_lm)
    b = copy.deepcopy(a)
    other = next(t for t in a.get_vocab() if t != a.eos_token)
    b.eos_token = other
    assert difference(a, b) == "" and fingerprint(a) == fingerprint(b)
    assert special_difference(a, b).startswith("eos_token_id ")
