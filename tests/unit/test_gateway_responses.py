"""The Responses API (`POST /v1/responses`, meshrl/gateway/responses.py) through the real `openai` client,
as the Agents SDK's default model and LangChain's use_responses_api call it (issue 58 item 4): a tool
round trip in function_call / function_call_output items, recorded token for token as the chat path
records it; the event stream; tool_choice required or named and a JSON response format accepted under the
stated rule (the model writes unconstrained; a named tool is the only one its prompt lists); what is not
served is a 400 naming the field."""

import json

import openai
import pytest

from meshrl.gateway.server import Gateway
from meshrl.tiny.arithmetic import CALCULATOR

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call><|im_end|>'
ANSWER = "6<|im_end|>"
TOOL = {"type": "function", **CALCULATOR["function"]}  # the Responses API's flat function tool
OTHER = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}


class Scripted:
    """Calls the calculator until a tool result is in the prompt, then answers; keeps each prompt."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def generate(self, session, ids, n, max_new, request):
        text = self.tok.decode(ids)
        self.prompts.append(text)
        tokens = self.tok(ANSWER if "<tool_response>" in text else CALL, add_special_tokens=False)["input_ids"]
        return [(tokens[:max_new], [-0.25] * len(tokens[:max_new]), None, 3)] * n


@pytest.fixture(scope="module")
def tok(bpe_tok):
    return bpe_tok


@pytest.fixture
def gateway(tok):
    ends = frozenset([tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")])
    g = Gateway(Scripted(tok), tok, "policy", ends, tool_parser="hermes").start()
    yield g
    g.stop()


def client(g, session):
    return openai.OpenAI(base_url=g.base_url, api_key=session.key, max_retries=0)


def test_a_tool_round_trip_in_items_is_recorded_as_chat_records_it(gateway, tok):
    s = gateway.open()
    c = client(gateway, s)
    first = c.responses.create(model="policy", instructions="Be brief.", input="2*3=", tools=[TOOL])
    [call] = first.output
    assert call.type == "function_call" and call.name == "calculator" and first.status == "completed"
    assert json.loads(call.arguments) == {"expression": "2*3"} and first.usage.output_tokens > 0
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "6"}
    items = [{"role": "user", "content": "2*3="}, call.model_dump(exclude_none=True), result]
    second = c.responses.create(model="policy", instructions="Be brief.", input=items, tools=[TOOL])
    assert second.output_text == "6" and second.output[0].type == "message"
    assert len(s.samples) == 1  # the second call extended the first's sample, as a chat history would
    traj = s.final()
    call_n, answer_n = (len(tok(t, add_special_tokens=False)["input_ids"]) for t in (CALL, ANSWER))
    assert sum(traj.mask) == call_n + answer_n and traj.versions == [3, 3]
    assert "Be brief." in tok.decode(traj.prompt) and "<tool_response>\n6" in tok.decode(traj.tokens)


def test_the_event_stream_ends_with_the_whole_response(gateway):
    s = gateway.open()
    events = list(client(gateway, s).responses.create(model="policy", input="2*3=", tools=[TOOL], stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds and "response.output_item.done" in kinds
    assert events[-1].response.output[0].name == "calculator"


def test_required_and_named_tools_and_json_formats_are_served_unconstrained(gateway):
    s = gateway.open()
    c = client(gateway, s)
    got = c.responses.create(model="policy", input="2*3=", tools=[TOOL, OTHER], tool_choice="required")
    assert got.output[0].type == "function_call"
    prompt = gateway.engine.prompts[-1]
    assert "calculator" in prompt and "weather" in prompt
    c.responses.create(
        model="policy", input="2*3=", tools=[TOOL, OTHER], tool_choice={"type": "function", "name": "weather"}
    )
    prompt = gateway.engine.prompts[-1]
    assert "weather" in prompt and "calculator" not in prompt  # the named tool is the only one listed
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    chat = c.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "2*3="}], response_format=fmt
    )
    assert "calculator" in chat.choices[0].message.content  # what the model wrote, not JSON: the agent decides


@pytest.mark.parametrize(
    "body,field",
    [
        ({"model": "p", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "p", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"model": "p", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"model": "p", "input": [{"role": "wizard", "content": "x"}]}, "input[0]"),
        ({"model": "p", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"model": "p", "input": []}, "input"),
        ({"input": "x"}, "model"),
    ],
)
def test_what_is_not_served_is_a_400_naming_the_field(gateway, body, field):
    s = gateway.open()
    with pytest.raises(openai.BadRequestError) as e:
        client(gateway, s).post("/responses", body=body, cast_to=dict)
    assert e.value.body["param"] == field and not s.samples
