"""A char-level HuggingFace tokenizer with a chat template, built from nothing.

Every printable ASCII character, space and newline is one token; <pad>, <s>,
</s>, <unk> and the role markers <|system|>, <|user|>, <|assistant|> are special
tokens. Assistant turns end with </s>, so a policy learns to stop. Saved with
left padding. (A Qwen2 model_type would make AutoTokenizer swap in Qwen2's
byte-level tokenizer; pair this with the Llama architecture.)
"""

import pathlib
import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
ROLES = ["<|system|>", "<|user|>", "<|assistant|>"]
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    # The newline is an expression, not template text: jinja's trim_blocks (vLLM renders with it)
    # would drop a literal newline that follows a block tag.
    "{% if m['role'] == 'assistant' %}</s>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate([*SPECIAL, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one char, one token
    tok.decoder = decoders.Fuse()  # join chars back without spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL + ROLES])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )


def save_tokenizer(out_dir: str | pathlib.Path) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    tok.save_pretrained(str(out_dir))
    return tok
