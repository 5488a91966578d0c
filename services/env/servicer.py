"""The EnvService over Python environments: one object per episode, in worker processes that can be
stopped (services/env/pool.py).

An environment class has reset(task: dict, seed: int | None) -> observation (or (observation, info)) and
step(action: str) -> (observation, reward, done, info), optionally close(), and optionally a class
attribute STOP: the strings that end a policy's turn (a tool call's closing tag), which Describe reports
(details["stop"], a JSON list) so that a run generates each turn up to them. Tools in the model's own
format: a class attribute TOOLS (function schemas, Describe's details["tools"], which a run's chat
template lists) and call(name, arguments: dict) -> text, which answers each tool call a run parsed from
the policy's turn (a Step with tool_calls_json; its reply's tool_results). Each call has
cfg.step_timeout: one that overruns stops the worker process it ran in (the episodes pinned there are
lost), one that raises or returns something else ends its episode, ABORTED with what went wrong (a
ValueError from the environment is INVALID_ARGUMENT: it refused the action). The service survives all of
it. Episodes end at done, at Close, or after idle_timeout without a call. This file keeps the episode
table; the pool runs the calls.
"""

import dataclasses
import json
import threading
import time
import uuid

from meshrl.config.env import EnvConfig
from meshrl.errors import Aborted, FailedPrecondition, InvalidArgument, ResourceExhausted
from meshrl.flags import settings_json
from meshrl.v1 import common_pb2, env_pb2
from services.env.pool import EnvPool, ProcessWorker


@dataclasses.dataclass(eq=False)
class Episode:
    worker: ProcessWorker  # the process holding its environment object
    last_used: float
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # one call at a time


def tool_calls(calls_json: str, max_chars: int) -> list[dict]:
    """A Step's tool calls: a JSON list of {"name": text, "arguments": object}; InvalidArgument otherwise."""
    if not calls_json:
        return []
    if len(calls_json) > max_chars:
        raise InvalidArgument(f"tool_calls_json of {len(calls_json)} characters exceeds --max-action-chars {max_chars}")
    try:
        calls = json.loads(calls_json)
    except ValueError as e:
        raise InvalidArgument(f"tool_calls_json is not JSON: {e}") from None
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict) for c in calls
    ):
        raise InvalidArgument('tool_calls_json must be a list of {"name": text, "arguments": object}')
    return calls


def check_task(task_json: str) -> None:
    """InvalidArgument unless task_json is a JSON object (the worker decodes it again)."""
    try:
        task = json.loads(task_json)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"task_json is not JSON: {e}") from None
    except RecursionError:
        raise InvalidArgument("task_json is nested too deeply to decode") from None
    if not isinstance(task, dict):
        raise InvalidArgument(f"task_json must be a JSON object, got {type(task).__name__}")


class EnvServicer:
    SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"]

    def __init__(self, cfg: EnvConfig):
        self.cfg = cfg
        self.set_serving = None  # the server's health, once it watches (meshrl.rpc.server)
        self.pool = EnvPool(cfg, on_health=self._health_changed)
        self.episodes: dict[str, Episode] = {}
        self.lock = threading.Lock()
        self.started = self.finished = 0

    def watch_health(self, set_serving) -> None:
        """The server hands us its health: NOT_SERVING while no worker can be started."""
        self.set_serving = set_serving
        set_serving(self.pool.serving)

    def _health_changed(self, serving: bool) -> None:
        if self.set_serving is not None:
            self.set_serving(serving)

    def Describe(self, request, context) -> common_pb2.ServiceInfo:
        return common_pb2.ServiceInfo(
            service="env",
            backend="python",
            model=self.cfg.module,
            details={
                "episodes_open": str(len(self.episodes)),
                "episodes_started": str(self.started),
                "max_episodes": str(self.cfg.max_episodes),
                "step_timeout_s": str(self.cfg.step_timeout),
                "processes": str(self.pool.size),
                "workers_replaced": str(self.pool.replaced),
                "stop": json.dumps(self.pool.described.get("stop", [])),
                "tools": json.dumps(self.pool.described.get("tools", [])),
                "settings": settings_json(self.cfg),
            },
        )

    def Reset(self, request, context) -> env_pb2.EnvReply:
        task_json = request.task_json or "{}"
        check_task(task_json)
        self._reap()
        with self.lock:
            if len(self.episodes) >= self.cfg.max_episodes:
                raise ResourceExhausted(
                    f"{len(self.episodes)} episodes are open (--max-episodes): close or finish some first"
                )
            self.started += 1
        episode_id = uuid.uuid4().hex
        worker = self.pool.assign()
        try:
            reply = self.pool.call(
                worker,
                {
                    "op": "reset",
                    "episode": episode_id,
                    "task_json": task_json,
                    "seed": str(request.seed) if request.HasField("seed") else None,
                },
                "reset",
            )
        except BaseException:
            self.pool.release(worker)
            raise
        with self.lock:
            self.episodes[episode_id] = Episode(worker, time.monotonic())
        return env_pb2.EnvReply(episode_id=episode_id, observation=reply["observation"], info_json=reply["info_json"])

    def Step(self, request, context) -> env_pb2.EnvReply:
        if len(request.action) > self.cfg.max_action_chars:
            raise InvalidArgument(
                f"action of {len(request.action)} characters exceeds --max-action-chars {self.cfg.max_action_chars}"
            )
        calls = tool_calls(request.tool_calls_json, self.cfg.max_action_chars)
        episode = self._episode(request.episode_id)
        with episode.lock:
            episode.last_used = time.monotonic()
            try:
                reply = self.pool.call(
                    episode.worker,
                    {"op": "step", "episode": request.episode_id, "action": request.action, "tool_calls": calls},
                    "step",
                )
            except BaseException:
                self._forget(request.episode_id)  # its worker has closed it, or is gone
                raise
            episode.last_used = time.monotonic()
        if reply["done"]:
            self._forget(request.episode_id)  # closed by its worker
        return env_pb2.EnvReply(
            episode_id=request.episode_id,
            observation=reply["observation"],
            reward=reply["reward"],
            done=reply["done"],
            info_json=reply["info_json"],
            tool_results=reply.get("tool_results", []),
        )

    def Close(self, request, context) -> env_pb2.CloseResponse:
        return env_pb2.CloseResponse(closed=self._end(request.episode_id))

    # ---- helpers -------------------------------------------------------------------------

    def _episode(self, episode_id: str) -> Episode:
        with self.lock:
            episode = self.episodes.get(episode_id)
        if episode is None:
            raise FailedPrecondition(
                f"no episode {episode_id!r}: it finished, was closed, sat idle past "
                f"{self.cfg.idle_timeout:g} s, or never started"
            )
        if episode.worker.lost:
            self._forget(episode_id)
            raise Aborted(f"episode lost: {episode.worker.lost}")
        return episode

    def _forget(self, episode_id: str) -> Episode | None:
        with self.lock:
            episode = self.episodes.pop(episode_id, None)
            self.finished += episode is not None
        if episode is not None:
            self.pool.release(episode.worker)
        return episode

    def _end(self, episode_id: str) -> bool:
        """Forget the episode and have its worker close it."""
        episode = self._forget(episode_id)
        if episode is not None and not episode.worker.lost:
            self.pool.notify(episode.worker, {"op": "close", "episode": episode_id})
        return episode is not None

    def _reap(self) -> None:
        """End episodes idle past idle_timeout (their caller went away without Close) or lost with their
        worker."""
        cutoff = time.monotonic() - self.cfg.idle_timeout
        with self.lock:
            idle = [
                k for k, e in self.episodes.items() if (e.last_used < cutoff or e.worker.lost) and not e.lock.locked()
            ]
        for k in idle:
            self._end(k)

    def close(self) -> None:
        self.pool.close()
