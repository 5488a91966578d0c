"""Tool calls in other families' formats through vLLM's own parsers (meshrl/vllm_tools.py, issue 58 item
17): for each format, a chat template that writes calls as that family does passes the tool path's probe
(the parser reads back the call the template writes), and a broken call is answered with its error in
place, never dropped. The templates are ChatML with each family's call syntax (its real template cannot be
downloaded here); the tokenizer gets the family's tool tokens, as special tokens where the family has them."""

import pytest
from transformers import AutoTokenizer

from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.tool_calls import Call, parser_for
from orchestrator.lifecycle.tool_template import probe

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
HERMES_CALL = (
    "<tool_call>{{ '\\n' }}{\"name\": {{ f['name'] | tojson }}, \"arguments\": {{ f['arguments'] if f['arguments'] "
    "is string else f['arguments'] | tojson }}}{{ '\\n' }}</tool_call>"
)
ARGS = "f['arguments'] | tojson"
DS = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"
FORMATS = {  # parser: (how the template writes one call, the family's special tokens, a good turn, a broken one)
    "qwen3_coder": (
        "<tool_call>\n<function={{ f['name'] }}>\n{% for k, v in f['arguments'].items() %}<parameter={{ k }}>\n"
        "{{ v }}\n</parameter>\n{% endfor %}</function>\n</tool_call>",
        [],
        "<tool_call>\n<function=calc>\n<parameter=x>\n2*3\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function",
    ),
    "glm45": (
        "<tool_call>{{ f['name'] }}\n{% for k, v in f['arguments'].items() %}<arg_key>{{ k }}</arg_key>\n"
        "<arg_value>{{ v }}</arg_value>\n{% endfor %}</tool_call>",
        [],
        "<tool_call>calc\n<arg_key>x</arg_key>\n<arg_value>2*3</arg_value>\n</tool_call>",
        "<tool_call>",
    ),
    "deepseek_v3": (
        f"{DS[0]}{DS[1]}function{DS[2]}{{{{ f['name'] }}}}\n```json\n{{{{ {ARGS} }}}}\n```{DS[3]}{DS[4]}",
        list(DS),
        f'{DS[0]}{DS[1]}function{DS[2]}calc\n```json\n{{"x": "2*3"}}\n```{DS[3]}{DS[4]}',
        f"{DS[0]}{DS[1]}function{DS[2]}calc\n```json\n{{bad\n```{DS[3]}{DS[4]}",
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": {{ f[\'name\'] | tojson }}, "arguments": {{ ' + ARGS + " }}}]",
        ["[TOOL_CALLS]"],
        '[TOOL_CALLS][{"name": "calc", "arguments": {"x": "2*3"}}]',
        '[TOOL_CALLS][{"name": "calc", "arguments": {bad',
    ),
    "llama3_json": (
        '{"name": {{ f[\'name\'] | tojson }}, "parameters": {{ ' + ARGS + " }}}",
        ["<|python_tag|>"],
        '{"name": "calc", "parameters": {"x": "2*3"}}',
        None,  # no start marker: a broken call cannot be told from an answer (stated in the module's docstring)
    ),
    "pythonic": (
        "[{{ f['name'] }}({% for k, v in f['arguments'].items() %}{{ k }}={{ v | tojson }}{% endfor %})]",
        [],
        '[calc(x="2*3")]',
        None,
    ),
}


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("fmt") / "m", TinyModelConfig(family="qwen2", tokenizer="bpe", **SMALL))


def family(chatml, name: str):
    """The tiny tokenizer with the family's tokens and a template that writes its calls."""
    call, tokens, _, _ = FORMATS[name]
    tok = AutoTokenizer.from_pretrained(chatml)
    if tokens:
        tok.add_special_tokens({"additional_special_tokens": tokens})
    template = (chatml / "chat_template.jinja").read_text()
    assert HERMES_CALL in template
    tok.chat_template = template.replace(HERMES_CALL, call)
    return tok


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_familys_template_writes_calls_its_parser_reads_back(chatml, name):
    tok = family(chatml, name)
    assert probe(tok, name, "rollout") == ""
    parser = parser_for(name, tok)
    good = FORMATS[name][2]
    assert parser(parser.readable(tok(good, add_special_tokens=False)["input_ids"])) == [Call("calc", {"x": "2*3"})]
    assert parser("The answer is 6.") == []


@pytest.mark.parametrize("name", [n for n, f in FORMATS.items() if f[3]])
def test_a_broken_call_is_answered_with_its_error_in_place(chatml, name):
    tok = family(chatml, name)
    parser = parser_for(name, tok)
    _, _, good, broken = FORMATS[name]
    [alone] = parser(broken)
    assert alone.error and not alone.name
    if name in ("qwen3_coder", "glm45", "deepseek_v3"):  # one marker per call: the good one is still made
        both = (
            parser(good + "\n" + broken)
            if name != "deepseek_v3"
            else parser(good.replace(DS[4], "") + broken[len(DS[0]) :])
        )
        assert [c.name for c in both] == ["calc", ""] and both[1].error


def test_a_parser_that_is_not_one_or_does_not_fit_is_refused_in_one_line(chatml):
    tok = AutoTokenizer.from_pretrained(chatml)
    with pytest.raises(ValueError, match="'nope' is not a parser: hermes, or one of vLLM's: .*qwen3_coder"):
        parser_for("nope", tok)
    with pytest.raises(ValueError, match="deepseek_v3 does not fit this tokenizer"):
        parser_for("deepseek_v3", tok)  # the family's tool tokens are not in this vocabulary
    with pytest.raises(ValueError, match="openai cannot read a whole turn here"):
        parser_for("openai", tok)  # gpt-oss's harmony: vLLM reads it with another parser
