"""A run whose samples are an agent program's episodes (issue 44), end to end: the calculator agent in
Node.js with the `openai` npm package (examples/node-agent, rollout.agent_command), the run's endpoint
in front of a real rollout service (hf backend), a Qwen2.5-shaped tiny model with its ChatML template,
GRPO with an actor service. Every episode is played and recorded (none lost) and the rollout's log-probs
of what it recorded agree with the actor's at the parity level of every other path. These checks serve
the Python agent's learning test too (tests/e2e/test_tool_template_learning.py); that the recording is
the environment path's trajectory token for token: tests/contract/test_multi_turn_tools.py."""

import json
import pathlib
import subprocess

import pytest
from node_example import needs_node

from testkit.tool_task import agent_step

ROOT = pathlib.Path(__file__).resolve().parents[2]


def agent_run(tmp_path, bpe_lm, agent: list[str]) -> pathlib.Path:
    """A 1-step GRPO run on the hermes calculator task whose episodes `agent` (overrides) plays."""
    out = agent_step(tmp_path, bpe_lm, agent)
    check_trained(out)
    return out


def check_trained(out: pathlib.Path) -> None:
    """What agent_step checked (check_agent_steps), and every sample has a response."""
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["response"] for s in samples)


@pytest.mark.slow
@needs_node
def test_an_agent_in_node_with_the_openai_npm_package_trains_too(tmp_path, bpe_lm):
    """The calculator agent written in Node.js (examples/node-agent), run as rollout.agent_command. (The
    Python agent, rollout.agent, trains in tests/e2e/test_tool_template_learning.py, checked the same way.)"""
    folder = ROOT / "examples/node-agent"
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder, check=True, timeout=300)
    agent_run(tmp_path, bpe_lm, [f"rollout.agent_command=node {folder / 'agent.js'}", "rollout.concurrency=4"])


SANDBOXED = """
import json, urllib.request
from openai import OpenAI


def sandbox(base_url, api_key, body):
    request = urllib.request.Request(
        base_url + "/sandbox/run", data=json.dumps(body).encode(), headers={"Authorization": "Bearer " + api_key}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)


def agent(task, base_url, api_key):
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = client.chat.completions.create(model="policy", messages=task["prompt"]).choices[0].message.content or ""
    save = f"open('reply', 'w').write({reply!r})"
    sandbox(base_url, api_key, {"argv": ["python3", "save.py"], "files": {"save.py": save}})
    counted = sandbox(base_url, api_key, {"argv": ["wc", "-c", "reply"]})  # the file the last call left
    return {"reward": float(counted["stdout"].split()[0] == str(len(reply.encode()))), "acc": True}
"""


@pytest.mark.slow
def test_an_agents_programs_run_in_its_episodes_sandbox(tmp_path, bpe_lm):
    """rollout.agent_sandbox=auto: the run starts a sandbox service, and each episode's agent runs programs
    there through the endpoint, in a session its next call finds again (every sample scores 1 only so)."""
    path = tmp_path / "sandboxed.py"
    path.write_text(SANDBOXED)
    out = agent_run(tmp_path, bpe_lm, [f"rollout.agent={path}:agent", "rollout.agent_sandbox=auto"])
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["score"] for s in samples] == [1.0] * len(samples)
