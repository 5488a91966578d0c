"""An agent written against the OpenAI API, trained with `rollout.agent=examples/agents/calculator.py:agent`.

It solves the bundled calculator task the way any tool-calling program would: it asks the model with the
calculator's schema listed (`tools=`), runs each call the model makes itself, sends the result back in
the tool role, and stops at the first reply without a call, its final answer. It returns the reward and
whatever else the run should log ("acc", "tool_calls").

The tool and the scoring are the bundled calculator environment's (services/env/calculator.py), so an
episode here is, token for token, the episode `rollout.multi_turn=true rollout.tool_parser=hermes` plays
through the environment service (tests/contract/test_multi_turn_tools.py checks it).
"""

import json

from openai import DefaultHttpxClient, OpenAI

from services.env.calculator import Calculator

MAX_CALLS = 4  # the run's rollout.max_turns caps it too: past it the endpoint answers with an empty turn
# One HTTP client for every episode this worker plays (its threads share it): an OpenAI client made with
# its own would set up TLS and a connection pool each time, 33 ms of CPU an episode here.
HTTP = DefaultHttpxClient()


def agent(task: dict, base_url: str, api_key: str) -> dict:
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=HTTP)
    calculator = Calculator()
    calculator.reset(task)
    messages = list(task["prompt"])
    for _ in range(MAX_CALLS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=task["tools"])
        message = reply.choices[0].message
        if not message.tool_calls:
            _, reward, _, info = calculator.step(message.content or "")
            return {"reward": reward, "acc": bool(info.get("acc")), "tool_calls": calculator.calls}
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            if call.type != "function":  # a custom tool: not one this agent offers
                continue
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError:
                arguments = {}
            result = calculator.call(call.function.name, arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"reward": 0.0, "acc": False, "tool_calls": calculator.calls}
