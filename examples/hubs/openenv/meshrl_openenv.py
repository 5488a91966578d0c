"""An OpenEnv environment (Meta's `openenv-core`: an environment server with reset and step over HTTP and
WebSocket) trained by meshrl as it is: this file runs in a venv with openenv-core (rollout.agent_python)
and talks to the environment's server, wherever it runs (a local process, a Docker container, a Hugging
Face Space), through OpenEnv's own client (GenericEnvClient: plain dicts, no environment package needed
here). Two uses, both given the server's address in OPENENV_URL:

    PY meshrl_openenv.py data OUT_DIR [--train N] [--test N]      # the server's problems as meshrl's rows
    rollout.agent=examples/hubs/openenv/meshrl_openenv.py:agent   # each episode: reset, replies, steps

The environment's side of the conversation is its observations' text field (OPENENV_PROMPT_FIELD,
default "prompt"), the policy's replies go back as its action's text field (OPENENV_ACTION_FIELD,
default "message"): OpenEnv leaves that mapping to the trainer (TRL's rollout functions write it per
environment); these two names are it here.

`data` resets the environment with seeds 0.. (train) and 1_000_000.. (test) and writes each first
observation as a row's prompt, with the seed in `extra_info.openenv_seed`. `agent` resets with the row's
seed (the same problem), then until the episode is done: the policy answers through the run's endpoint
(recorded token for token), the answer is the action, the next observation's text the next user turn.
The reward is the environment's (the sum of its steps' rewards); an episode whose environment fails (the
server unreachable, an error) is lost and counted, not scored 0.
"""

from __future__ import annotations

import argparse
import os
import sys

from openai import OpenAI
from openenv.core.generic_client import GenericEnvClient

MODEL = "policy"  # the endpoint serves the run's policy under any name
MAX_TURNS = 8  # the run's rollout.max_turns caps the policy's turns too
TEST_SEEDS = 1_000_000  # the held-out problems' seeds start here


def url() -> str:
    if not os.environ.get("OPENENV_URL"):
        raise ValueError("OPENENV_URL is not set: the environment server's address, e.g. http://127.0.0.1:8000")
    return os.environ["OPENENV_URL"]


def field(name: str, default: str) -> str:
    return os.environ.get(name) or default


def agent(task: dict, base_url: str, api_key: str) -> dict:
    seed = int((task.get("extra_info") or {})["openenv_seed"])
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    prompt_field, action_field = field("OPENENV_PROMPT_FIELD", "prompt"), field("OPENENV_ACTION_FIELD", "message")
    with GenericEnvClient(base_url=url()).sync() as env:
        step = env.reset(seed=seed)
        messages = [{"role": "user", "content": str(step.observation.get(prompt_field, ""))}]
        total, acc = 0.0, False
        for _ in range(MAX_TURNS):
            reply = client.chat.completions.create(model=MODEL, messages=messages)
            text = reply.choices[0].message.content or ""
            step = env.step({action_field: text})
            total += float(step.reward or 0.0)
            acc = bool(step.observation.get("acc", acc))  # a field: OpenEnv sends no metadata over the wire
            if step.done:
                break
            said = str(step.observation.get(prompt_field, ""))
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": said}]
    return {"reward": total, "acc": acc}


def write(out_dir: str, train: int, test: int) -> None:
    import json
    import pathlib

    folder = pathlib.Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    prompt_field = field("OPENENV_PROMPT_FIELD", "prompt")
    with GenericEnvClient(base_url=url()).sync() as env:
        for split, seeds in (("train", range(train)), ("test", range(TEST_SEEDS, TEST_SEEDS + test))):
            table = []
            for seed in seeds:
                text = str(env.reset(seed=seed).observation.get(prompt_field, ""))
                table.append(
                    {
                        "data_source": "openenv",
                        "prompt": [{"role": "user", "content": text}],
                        "reward_model": {"ground_truth": ""},  # the environment scores
                        "extra_info": {"openenv_seed": seed},
                    }
                )
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in table))
            print(f"{folder / f'{split}.jsonl'}: {len(table)} rows")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl_openenv.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="the server's problems (first observations) as train.jsonl and test.jsonl")
    data.add_argument("out_dir")
    data.add_argument("--train", type=int, default=1000, help="train problems (seeds 0..)")
    data.add_argument("--test", type=int, default=200, help=f"held-out problems (seeds {TEST_SEEDS}..)")
    a = p.parse_args(argv)
    try:
        write(a.out_dir, a.train, a.test)
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
