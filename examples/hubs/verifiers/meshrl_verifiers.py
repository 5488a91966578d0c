"""A verifiers environment (prime-rl's `verifiers` package, its 0.3 API) trained by meshrl as it is: this
file runs in the environment's own venv (rollout.agent_python), where verifiers and the environment are
installed and meshrl is not. Two uses:

    PY meshrl_verifiers.py data ENV_ID OUT_DIR [--args JSON] [--n N]    # its datasets as meshrl's parquet
    rollout.agent=examples/hubs/verifiers/meshrl_verifiers.py:agent     # each episode: its rollout and rubric

`data` calls `verifiers.load_environment(ENV_ID, **args)` and writes the environment's dataset (train)
and eval dataset (test) as rows meshrl reads: `prompt` the environment's own formatted messages (its
system prompt and few-shot turns included), `reward_model.ground_truth` its answer, and
`extra_info.verifiers` what the episode needs to play the row again (the environment's id and args, the
row's prompt, example_id, answer, info and task), as JSON text.

`agent` plays one episode: the environment's own `rollout` (its turns, its tools, its parser) against the
run's OpenAI endpoint. The endpoint records every call token for token, so the run trains on exactly what
the environment saw. `score_group` then scores each group (a prompt's rollout.n episodes) as verifiers'
own `run_group` does: its rubric's `score_group`, so group reward functions (which compare a group's
replies) see every reply. The episode's reward is the rubric's weighted sum, its accuracy whether that
reaches the environment's pass_threshold. The run plays a group's episodes on one worker process
(orchestrator/agents/pool.py), where their states wait for the scoring; an environment is loaded once per
worker process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading

import verifiers as vf
from openai import AsyncOpenAI
from verifiers import errors

MODEL = "policy"  # the endpoint serves the run's policy under any name
# what the policy itself did (an empty or unreadable reply, a conversation it let outgrow the context, a
# tool call it wrote badly): the rubric's score stands, as for any other reply; any other failure (the
# endpoint, a tool, a sandbox) loses the episode, which the run counts instead of training on a 0
POLICY_ERRORS = (errors.InvalidModelResponseError, errors.OverlongPromptError, errors.ToolParseError)
MAX_KEPT = 10_000  # played states waiting for their group's scoring (a failed step's never come)
_loaded: dict[str, vf.Environment] = {}
_played: dict[str, tuple[vf.Environment, vf.State]] = {}  # an episode's key -> its state, until scored
_lock = threading.Lock()


def environment(env_id: str, args: dict) -> vf.Environment:
    """The environment, loaded once per worker process (episodes play on threads)."""
    key = json.dumps([env_id, args], sort_keys=True)
    with _lock:
        if key not in _loaded:
            # verifiers sets SIGINT/SIGTERM handlers as an environment is made, which Python allows the main
            # thread alone; an episode's thread makes it here, and the run stops workers by killing them
            real = signal.signal
            signal.signal = lambda *_: None  # type: ignore[assignment]
            try:
                _loaded[key] = vf.load_environment(env_id, **args)
            finally:
                signal.signal = real
        return _loaded[key]


def agent(task: dict, base_url: str, api_key: str) -> dict:
    extra = task.get("extra_info") or {}
    if "verifiers" not in extra:
        raise ValueError("the row has no extra_info.verifiers: make the data with `meshrl_verifiers.py data`")
    row = json.loads(extra["verifiers"])
    env = environment(row["env_id"], row["env_args"])
    episode = row["input"]  # the environment's own prompt, as its dataset formatted it
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0))
    state = asyncio.run(env.rollout(episode, client, MODEL, {}))
    error = state.get("error")
    if error and not policy_made(error):
        raise RuntimeError(f"the environment's rollout failed: {error}")
    with _lock:
        _played[api_key] = (env, state)
        while len(_played) > MAX_KEPT:
            _played.pop(next(iter(_played)))
    return {"reward": 0.0}  # its group's score (score_group) takes its place


def score_group(keys: list[str], tasks: list[dict], results: list) -> list:
    """The group's episodes (by their keys; results[i] None where the run lost episode i) scored together by
    the environment's rubric; a group missing an episode is lost whole where its rubric compares replies."""
    with _lock:  # every key's state goes, a lost episode's too (one the run gave up on after it played)
        played = [_played.pop(k, None) for k in keys]
    played = [p if r is not None else None for p, r in zip(played, results)]
    kept = [p for p in played if p is not None]
    if not kept:
        return [None] * len(keys)
    env, states = kept[0][0], [state for _, state in kept]
    if len(kept) < len(keys) and env.requires_group_rollouts:
        lost = len(keys) - len(kept)
        raise RuntimeError(f"{lost} of its {len(keys)} episodes were lost, and its rubric compares them")

    async def score() -> None:
        await env.rubric.score_group(states)
        for state in states:
            await env.rubric.cleanup(state)

    asyncio.run(score())
    reward = lambda s: {"reward": float(s["reward"]), "acc": float(s["reward"]) >= env.pass_threshold}  # noqa: E731
    return [None if p is None else reward(p[1]) for p in played]


def policy_made(error) -> bool:
    """Whether a rollout's error is one of POLICY_ERRORS: the exception itself, or its class's name under
    "error" where the output holds it serialized."""
    if isinstance(error, BaseException):
        return isinstance(error, POLICY_ERRORS)
    kind = getattr(errors, str(error.get("error") if isinstance(error, dict) else ""), None)
    return isinstance(kind, type) and issubclass(kind, POLICY_ERRORS)


def rows(env: vf.Environment, dataset, env_id: str, args: dict) -> list[dict]:
    """The dataset's rows as meshrl reads them."""
    out = []
    for r in dataset.to_list():
        info = r.get("info") or {}
        played = {k: r[k] for k in ("prompt", "example_id", "answer", "task") if r.get(k) is not None}
        played["info"] = info if isinstance(info, dict) else json.loads(info)
        out.append(
            {
                "data_source": f"verifiers/{env_id}",
                "prompt": r["prompt"],
                "reward_model": {"ground_truth": str(r.get("answer") or "")},
                "extra_info": {"verifiers": json.dumps({"env_id": env_id, "env_args": args, "input": played})},
            }
        )
    return out


def write(out_dir: str, env_id: str, args: dict, n: int) -> None:
    import pathlib

    import pandas as pd

    env = environment(env_id, args)
    folder = pathlib.Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for split, dataset in (("train", env.get_dataset(n)), ("test", env.get_eval_dataset(n))):
        table = rows(env, dataset, env_id, args)
        pd.DataFrame(table).to_parquet(folder / f"{split}.parquet")
        print(f"{folder / f'{split}.parquet'}: {len(table)} rows")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl_verifiers.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="write the environment's datasets as meshrl's train/test parquet")
    data.add_argument("env_id", help="an installed verifiers environment (its module's name)")
    data.add_argument("out_dir")
    data.add_argument("--args", default="{}", help="load_environment's keyword arguments, as JSON")
    data.add_argument("--n", type=int, default=-1, help="rows of each split (-1: all)")
    a = p.parse_args(argv)
    try:
        args = json.loads(a.args)
    except ValueError as e:
        p.error(f"--args is not JSON: {e}")
    if not isinstance(args, dict):
        p.error("--args must be a JSON object")
    write(a.out_dir, a.env_id, args, a.n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
