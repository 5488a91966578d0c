"""Tool-call parsers (meshrl/tool_calls.py): calls in the order written, each usable or with its error."""

from meshrl.tool_calls import PARSERS, Call, hermes


def test_one_call():
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
    assert hermes(text) == [Call("calculator", {"expression": "12*7"})]
    assert PARSERS["hermes"] is hermes


def test_none_in_a_plain_answer():
    assert hermes("84") == [] and hermes("") == []


def test_several_calls_and_text_around_them():
    text = 'Let me.<tool_call>{"name": "a", "arguments": {}}</tool_call> and <tool_call>{"name": "b"}</tool_call>'
    assert hermes(text) == [Call("a", {}), Call("b", {})]  # no arguments: an empty object


def test_arguments_as_json_text_as_openai_writes_them():
    assert hermes('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>') == [Call("a", {"x": 1})]


def test_what_cannot_be_called_carries_its_error_in_place():
    text = (
        "<tool_call>{bad</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "a", "arguments": [1]}</tool_call>'
        '<tool_call>["a"]</tool_call>'
        '<tool_call>{"name": "ok", "arguments": {"x": 2}}</tool_call>'
        '<tool_call>{"name": "cut'
    )
    calls = hermes(text)
    assert [c.name for c in calls] == ["", "", "", "", "ok", ""]
    assert "not JSON" in calls[0].error and "name" in calls[1].error and "arguments" in calls[2].error
    assert calls[3].error and not calls[4].error and "not closed" in calls[5].error
