"""The chat template on the tool path (orchestrator/lifecycle/tool_template.py): a template that does not
render the tool schema, a tool call its parser reads back, or a tool result is refused before any service
starts, in one line naming what is missing and where the template is; the tiny BPE model's ChatML
template passes."""

import json
import re
import shutil

import pytest
from transformers import AutoTokenizer

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.lifecycle.preflight import check
from orchestrator.lifecycle.tool_template import probe
from orchestrator.main import LOOPS

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
HEADER = "'<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
GENERATION = "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
# Llama 3.0's template (without its bos_token, which the tiny tokenizer has none of): no tools anywhere
LLAMA3 = "{% for m in messages %}{{ " + HEADER + " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}" + GENERATION
# lists the tools, but writes a call turn as its (empty) content
NO_CALLS = "{% if tools %}{{ tools | tojson }}{% endif %}" + LLAMA3
# Llama 3.1's JSON calls ({"name": ..., "parameters": ...}), which hermes does not read
LLAMA31_CALLS = (
    "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ " + HEADER + " }}"
    "{% if m.tool_calls %}{% set f = m.tool_calls[0].function %}"
    "{{ '{\"name\": \"' + f.name + '\", \"parameters\": ' + f.arguments | tojson + '}' }}"
    "{% else %}{{ m['content'] }}{% endif %}{{ '<|eot_id|>' }}{% endfor %}" + GENERATION
)
# Hermes calls, but tool results dropped
NO_RESULTS = (
    "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{% if m.role != 'tool' %}{{ " + HEADER + " }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}{{ m['content'] }}{{ '<|eot_id|>' }}{% endif %}{% endfor %}" + GENERATION
)


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    """A Qwen2-shaped tiny model with the bundled ChatML template (tools, Hermes calls, tool results)."""
    return make_model(
        tmp_path_factory.mktemp("tools") / "chatml", TinyModelConfig(family="qwen2", tokenizer="bpe", **SMALL)
    )


def with_template(chatml, tmp_path, template: str):
    """A copy of the model whose template is `template`, in tokenizer_config.json as older checkpoints keep it."""
    folder = tmp_path / "model"
    shutil.copytree(chatml, folder)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return folder


@pytest.fixture(scope="module")
def tool_sft_data(tmp_path_factory):
    """Conversations with calculator calls (data.prompt_key=messages), as TRL's tool datasets hold them."""
    config = ArithmeticConfig(ops="*", num_train=16, num_test=4, tool=True, tool_share=1.0, tool_format="hermes")
    return make_data(tmp_path_factory.mktemp("tool_data"), config)


def preflight(algorithm: str, model, data, *extra: str) -> None:
    cfg = load_config(None, [f"actor.model={model}", f"data.train_files={data}", "data.train_batch_size=4", *extra])
    check(cfg, LOOPS[algorithm]().setup(cfg))


HERMES = ("rollout.n=2", "rollout.multi_turn=true", "rollout.tool_parser=hermes", "rollout.max_turns=2")


def test_the_bundled_chatml_template_renders_the_whole_tool_path(chatml, arithmetic_data, tool_sft_data):
    tok = AutoTokenizer.from_pretrained(chatml)
    assert probe(tok, "hermes", "rollout") == "" and probe(tok, "", "sft") == ""
    preflight("grpo", chatml, arithmetic_data["train"], *HERMES)
    preflight("sft", chatml, tool_sft_data["train"], "data.prompt_key=messages")


def test_a_llama3_template_on_the_tool_path_is_refused_naming_the_template(chatml, tmp_path, arithmetic_data):
    model = with_template(chatml, tmp_path, LLAMA3)
    line = (
        rf"the chat template of {model} \({model}/tokenizer_config.json's chat_template\) does not render the "
        r"tool schema given as tools= .*; rollout.tool_parser=hermes needs a template with tool support"
    )
    with pytest.raises(ValueError, match=line) as refused:
        preflight("grpo", model, arithmetic_data["train"], *HERMES)
    assert "\n" not in str(refused.value)
    preflight("grpo", model, arithmetic_data["train"], *HERMES[:-2])  # the text protocol needs no tool support


def test_sft_on_tool_calls_with_a_llama3_template_is_refused(chatml, tmp_path, tool_sft_data, arithmetic_data):
    model = with_template(chatml, tmp_path, LLAMA3)
    with pytest.raises(ValueError, match=r"does not render the tool schema .*; SFT on tool calls \(data.train_files\)"):
        preflight("sft", model, tool_sft_data["train"], "data.prompt_key=messages")
    preflight("sft", model, arithmetic_data["train"])  # no tool calls in the rows: no tool path


@pytest.mark.parametrize(
    "template, missing",
    [
        (NO_CALLS, r"does not render an assistant tool call \(tool_calls\): the call turn is '.*<\|eot_id\|>'"),
        (
            LLAMA31_CALLS,
            r"writes a tool call that rollout.tool_parser=hermes does not read back: "
            r"'.*\{\"name\": \"probe_lookup_zq\", \"parameters\": .*' parses to no call",
        ),
        (NO_RESULTS, r"does not render tool results \(role 'tool'\): 'probe result 9137' is not in"),
    ],
)
def test_each_missing_piece_is_named(chatml, tmp_path, template, missing):
    said = probe(AutoTokenizer.from_pretrained(with_template(chatml, tmp_path, template)), "hermes", "rollout")
    assert re.search(missing, said), said


def test_a_template_that_fails_to_render_is_named_not_raised(chatml, tmp_path):
    tok = AutoTokenizer.from_pretrained(
        with_template(chatml, tmp_path, "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}")
    )
    assert probe(tok, "hermes", "rollout") == "cannot render a prompt with tools: TemplateError: no tools here"
