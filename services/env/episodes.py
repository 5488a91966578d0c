"""The environment objects of one worker, by episode id, and the checks on what they return.

This runs where the objects live: a worker process (services/env/worker.py). Requests and replies are
plain dicts of strings and numbers, so that they can cross a pipe as frames: a request is {"op":
"reset", "episode", "task_json", "seed"}, {"op": "step", "episode", "action", "tool_calls"} or {"op":
"close", "episode"}; a reply is
{"observation", "reward", "done", "info_json", "tool_results"}, or {"error": "invalid" | "aborted",
"message"} for what the service answers INVALID_ARGUMENT (the environment refused: it raised
ValueError) or ABORTED (it failed or answered nonsense). An episode that fails or is done is closed here, at once.
"""

import json
import logging
import math
import threading
from typing import Any

log = logging.getLogger(__name__)


class EnvError(Exception):
    """What went wrong in an environment's call: `kind` "invalid" or "aborted"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Episodes:
    def __init__(self, factory):
        self.factory = factory
        self.envs: dict[str, Any] = {}  # the user's environment objects: any class with reset and step
        self.lock = threading.Lock()  # calls for different episodes run at once, on threads

    def handle(self, request: dict) -> dict:
        """The reply to one request (see the module's docstring); never raises for the environment's sake."""
        op, episode = request["op"], request["episode"]
        try:
            if op == "reset":
                return self.reset(episode, request["task_json"], request.get("seed"))
            if op == "step":
                if request.get("tool_calls"):
                    return self.call_tools(episode, request["tool_calls"])
                return self.step(episode, request["action"])
            assert op == "close", op
            self.close(episode)
            return {}
        except EnvError as e:
            return {"error": e.kind, "message": str(e)}

    def reset(self, episode: str, task_json: str, seed: str | None) -> dict:
        env = run("create", self.factory)
        try:
            out = run("reset", env.reset, json.loads(task_json), None if seed is None else int(seed))
            observation, info = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
            reply = {
                "observation": text(observation, "reset"),
                "reward": 0.0,
                "done": False,
                "info_json": info_json(info),
            }
        except EnvError:
            close(env)
            raise
        with self.lock:
            self.envs[episode] = env
        return reply

    def step(self, episode: str, action: str) -> dict:
        with self.lock:
            env = self.envs.get(episode)
        if env is None:  # closed (by Close or the idle reaper) while the step was on its way
            raise EnvError("aborted", "the episode was closed")
        try:
            observation, reward, done, info = checked_step(run("step", env.step, action))
            reply = {"observation": observation, "reward": reward, "done": done, "info_json": info_json(info)}
        except EnvError:
            self.close(episode)
            raise
        if done:
            self.close(episode)
        return reply

    def call_tools(self, episode: str, calls: list[dict]) -> dict:
        """The tool calls a run parsed from the policy's turn, each answered by the environment's
        call(name, arguments) -> text; the episode goes on (reward 0)."""
        with self.lock:
            env = self.envs.get(episode)
        if env is None:
            raise EnvError("aborted", "the episode was closed")
        if not callable(getattr(env, "call", None)):
            self.close(episode)
            raise EnvError("invalid", "this environment takes no tool calls (it has no call(name, arguments))")
        try:
            results = [text(run("call", env.call, c["name"], c["arguments"]), "call") for c in calls]
        except EnvError:
            self.close(episode)
            raise
        return {"observation": "", "reward": 0.0, "done": False, "info_json": "{}", "tool_results": results}

    def close(self, episode: str) -> None:
        with self.lock:
            env = self.envs.pop(episode, None)
        if env is not None:
            close(env)

    def close_all(self) -> None:
        for episode in list(self.envs):
            self.close(episode)


def describe(factory) -> dict:
    """What Describe reports of the class: STOP, the strings that end a policy's turn in the text protocol,
    and TOOLS, the function schemas of the tools its call(name, arguments) answers."""
    stop = list(getattr(factory, "STOP", None) or [])
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"the environment's STOP must be a list of non-empty strings, got {stop!r}")
    tools = list(getattr(factory, "TOOLS", None) or [])
    if not all(isinstance(t, dict) and (t.get("function") or t).get("name") for t in tools):
        raise ValueError("the environment's TOOLS must be a list of function schemas, each with a name")
    json.dumps(tools)  # a schema must travel as JSON
    return {"stop": stop, "tools": tools}


def run(what: str, fn, *args):
    """fn(*args); the environment's exception as the EnvError it becomes."""
    try:
        return fn(*args)
    except ValueError as e:
        raise EnvError("invalid", f"the environment refused this in {what}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the environment is user code; the service stays up
        log.warning("environment failed in %s", what, exc_info=True)
        raise EnvError("aborted", f"the environment failed in {what}: {type(e).__name__}: {e}") from None


def text(observation, what: str) -> str:
    if observation is None:
        return ""
    if not isinstance(observation, str):
        raise EnvError(
            "aborted",
            f"the environment's {what} returned a {type(observation).__name__} "
            "observation; it must return text" + (" (or (text, info))" if what == "reset" else ""),
        )
    return observation


def checked_step(out) -> tuple[str, float, bool, object]:
    if not isinstance(out, tuple) or len(out) != 4:
        raise EnvError(
            "aborted", f"the environment's step must return (observation, reward, done, info), got {type(out).__name__}"
        )
    observation, reward, done, info = out
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise EnvError("aborted", f"the environment's step returned reward {reward!r}, not a number") from None
    if not math.isfinite(reward):
        raise EnvError("aborted", f"the environment's step returned reward {reward}")
    return text(observation, "step"), reward, bool(done), info


def info_json(info) -> str:
    if info is None:
        return "{}"
    if not isinstance(info, dict):
        raise EnvError("aborted", f"the environment's info must be a dict, got {type(info).__name__}")
    try:
        return json.dumps(info, default=str)
    except (TypeError, ValueError, RecursionError) as e:
        raise EnvError("aborted", f"the environment's info cannot be written as JSON: {e}") from None


def close(env) -> None:
    close_fn = getattr(env, "close", None)
    if callable(close_fn):
        try:
            close_fn()
        except Exception:  # noqa: BLE001 - an episode that fails to clean up is still over
            log.warning("an environment failed to close its episode", exc_info=True)
