"""A byte-level BPE tokenizer with a ChatML chat template, trained locally on a task's text.

What real checkpoints (Qwen2.5, Qwen3) bring and the char-level tokenizer does not: merges learned from
text, every byte reachable, digits one token each (as Qwen splits them), two end tokens (<|im_end|>
closes a turn and is the tokenizer's eos, <|endoftext|> ends a document and pads; both end
generation), and a template with system, user, assistant and tool roles that lists tool schemas in the
system turn and writes tool calls Hermes-style:

    <|im_start|>assistant
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*7"}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    84
    </tool_response><|im_end|>

<tool_call> and <tool_response> and their closing tags are added tokens but not special ones, so they
stay in text decoded with skip_special_tokens (a tool-call parser reads them there), as in Qwen's.
Training is deterministic: the same corpus gives the same merges.
"""

import pathlib
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

END_OF_TEXT, START, END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL = [END_OF_TEXT, START, END]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
NL = "{{ '\\n' }}"  # a newline as an expression: jinja's trim_blocks (transformers and vLLM render with it)
# would drop one written after a block tag
CHAT_TEMPLATE = "".join(
    [
        "{%- set ns = namespace(system='') -%}",
        "{%- if messages and messages[0]['role'] == 'system' -%}{%- set ns.system = messages[0]['content'] -%}",
        "{%- endif -%}",
        "{%- if ns.system or tools -%}",
        f"<|im_start|>system{NL}{{{{ ns.system }}}}",
        "{%- if tools -%}",
        f"{{{{ '\\n\\n' if ns.system else '' }}}}Tools you can call:{NL}<tools>",
        f"{{%- for t in tools -%}}{NL}{{{{ t | tojson }}}}{{%- endfor -%}}{NL}</tools>{NL}",
        'Call one with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.',
        "{%- endif -%}",
        f"<|im_end|>{NL}",
        "{%- endif -%}",
        "{%- for m in messages -%}",
        "{%- if m['role'] == 'system' and loop.first -%}",
        "{%- elif m['role'] == 'tool' -%}",
        # a run of tool results is one user turn, each in <tool_response> tags
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}<|im_start|>user{%- endif -%}",
        f"{NL}<tool_response>{NL}{{{{ m['content'] }}}}{NL}</tool_response>",
        f"{{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}}<|im_end|>{NL}{{%- endif -%}}",
        "{%- elif m['role'] == 'assistant' -%}",
        f"<|im_start|>assistant{NL}{{{{ m['content'] or '' }}}}",
        "{%- for c in (m['tool_calls'] or []) -%}",
        "{%- set f = c['function'] if c['function'] is defined and c['function'] else c -%}",
        f"{{{{ '\\n' if (m['content'] or not loop.first) else '' }}}}<tool_call>{NL}",
        '{"name": {{ f[\'name\'] | tojson }}, "arguments": ',
        "{{ f['arguments'] if f['arguments'] is string else f['arguments'] | tojson }}}",
        f"{NL}</tool_call>",
        "{%- endfor -%}",
        f"<|im_end|>{NL}",
        "{%- else -%}",
        f"<|im_start|>{{{{ m['role'] }}}}{NL}{{{{ m['content'] }}}}<|im_end|>{NL}",
        "{%- endif -%}",
        "{%- endfor -%}",
        f"{{%- if add_generation_prompt -%}}<|im_start|>assistant{NL}{{%- endif -%}}",
    ]
)


VISION = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]  # Qwen2-VL's, as it names them
# A vision-language model's template: a message's content may be parts, a picture written as Qwen2-VL's
# template writes it (the image token between its start and end marks), text as it is.
PARTS = (
    "{%- if m['content'] is string -%}{{ m['content'] }}{%- else -%}{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif p['type'] == 'text' -%}{{ p['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}"
)
VISION_TEMPLATE = CHAT_TEMPLATE.replace(
    f"<|im_start|>{{{{ m['role'] }}}}{NL}{{{{ m['content'] }}}}<|im_end|>",
    f"<|im_start|>{{{{ m['role'] }}}}{NL}{PARTS}<|im_end|>",
)
assert VISION_TEMPLATE != CHAT_TEMPLATE


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512, max_length: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE of vocab_size tokens (the 256 bytes, the special tokens, merges) trained on corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),  # a digit is a token of its own
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL, *TOOL_TAGS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    # the tags were learned as whole tokens above; here they are marked: special ones vanish from decoded
    # text with skip_special_tokens, the tool tags stay in it
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END,
        pad_token=END_OF_TEXT,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
    )


def end_ids(tokenizer) -> list[int]:
    """Every token that ends generation: <|im_end|> (a turn) and <|endoftext|> (a document)."""
    return [tokenizer.convert_tokens_to_ids(t) for t in (END, END_OF_TEXT)]


def save_tokenizer(
    out_dir: str | pathlib.Path, corpus: Iterable[str], vocab_size: int, vision: bool = False
) -> PreTrainedTokenizerFast:
    """vision: with Qwen2-VL's image and video tokens (special) and the template that writes pictures."""
    tok = train_tokenizer(corpus, vocab_size)
    if vision:
        tok.add_special_tokens({"additional_special_tokens": VISION})
        tok.chat_template = VISION_TEMPLATE
    tok.save_pretrained(str(out_dir))
    return tok


def file_texts(path: str | pathlib.Path) -> list[str]:
    """Every string in a data file's rows (any kind meshrl.rows reads: prompts, chat messages' contents,
    answers), to train a tokenizer on a task's own words."""
    from meshrl.rows import plain, read_rows  # here: only a tokenizer trained on a file needs pandas

    texts: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            texts.append(value)
        for v in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            walk(v)

    for record in read_rows(pathlib.Path(path), "bpe_corpus").to_dict("records"):
        walk(plain(record))
    return texts
