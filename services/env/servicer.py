"""The EnvService over Python environments: one object per episode, each call under a time limit.

An environment class has reset(task: dict, seed: int | None) -> observation (or (observation, info)) and
step(action: str) -> (observation, reward, done, info), optionally close(), and optionally a class
attribute STOP: the strings that end a policy's turn (a tool call's closing tag), which Describe reports
(details["stop"], a JSON list) so that a run generates each turn up to them. Its calls run on a pool
with cfg.step_timeout: one that overruns, raises or returns something else ends its episode, ABORTED
with what went wrong (a ValueError from the environment is INVALID_ARGUMENT: it refused the action).
The service survives all of it. Episodes end at done, at Close, or after idle_timeout without a call.
"""

import concurrent.futures
import dataclasses
import importlib
import json
import logging
import math
import threading
import time
import uuid

from meshrl.errors import Aborted, FailedPrecondition, InvalidArgument, ResourceExhausted
from meshrl.v1 import common_pb2, env_pb2
from services.env.config import EnvConfig

log = logging.getLogger(__name__)


def load_env(spec: str):
    """The class named by "package.module:Class" or "path/to/file.py:Class"."""
    path, _, name = spec.rpartition(":")
    if path.endswith(".py"):
        from services.reward.functions import find

        return find(spec, kind="environment")
    try:
        cls = getattr(importlib.import_module(path), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"environment {spec!r} cannot be loaded: {type(e).__name__}: {e}") from e
    if not callable(cls):
        raise ValueError(f"environment {spec!r} is not a class")
    return cls


@dataclasses.dataclass(eq=False)
class Episode:
    env: object
    last_used: float
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # one call at a time


class EnvServicer:
    SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"]

    def __init__(self, cfg: EnvConfig, factory=None):
        self.cfg = cfg
        self.factory = factory or load_env(cfg.env)
        self.episodes: dict[str, Episode] = {}
        self.lock = threading.Lock()
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.workers, thread_name_prefix="meshrl-env")
        self.started = self.finished = 0

    def Describe(self, request, context) -> common_pb2.ServiceInfo:
        return common_pb2.ServiceInfo(service="env", backend="python", model=self.cfg.env, details={
            "episodes_open": str(len(self.episodes)), "episodes_started": str(self.started),
            "max_episodes": str(self.cfg.max_episodes), "step_timeout_s": str(self.cfg.step_timeout),
            "stop": json.dumps(list(getattr(self.factory, "STOP", [])))})

    def Reset(self, request, context) -> env_pb2.EnvReply:
        try:
            task = json.loads(request.task_json or "{}")
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"task_json is not JSON: {e}") from None
        if not isinstance(task, dict):
            raise InvalidArgument(f"task_json must be a JSON object, got {type(task).__name__}")
        self._reap()
        with self.lock:
            if len(self.episodes) >= self.cfg.max_episodes:
                raise ResourceExhausted(f"{len(self.episodes)} episodes are open (--max-episodes): close or "
                                        "finish some first")
            self.started += 1
        seed = request.seed if request.HasField("seed") else None
        env = self._call(None, "create", self.factory)
        out = self._call(env, "reset", env.reset, task, seed)
        observation, info = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
        if observation is None:
            observation = ""
        if not isinstance(observation, str):
            self._close(env)
            raise Aborted(f"the environment's reset returned a {type(observation).__name__} observation; "
                          "it must return text (or (text, info))")
        info_json = self._info_json(env, info)
        episode_id = uuid.uuid4().hex
        with self.lock:
            self.episodes[episode_id] = Episode(env, time.monotonic())
        return env_pb2.EnvReply(episode_id=episode_id, observation=observation, info_json=info_json)

    def Step(self, request, context) -> env_pb2.EnvReply:
        if len(request.action) > self.cfg.max_action_chars:
            raise InvalidArgument(f"action of {len(request.action)} characters exceeds --max-action-chars "
                                  f"{self.cfg.max_action_chars}")
        with self.lock:
            episode = self.episodes.get(request.episode_id)
        if episode is None:
            raise FailedPrecondition(f"no episode {request.episode_id!r}: it finished, was closed, sat idle past "
                                     f"{self.cfg.idle_timeout:g} s, or never started")
        with episode.lock:
            episode.last_used = time.monotonic()
            try:
                out = self._call(episode.env, "step", episode.env.step, request.action)
                observation, reward, done, info = self._check_step(out)
                info_json = self._info_json(episode.env, info)
            except BaseException:
                self._end(request.episode_id)
                raise
            episode.last_used = time.monotonic()
        if done:
            self._end(request.episode_id)
        return env_pb2.EnvReply(episode_id=request.episode_id, observation=observation, reward=reward, done=done,
                                info_json=info_json)

    def Close(self, request, context) -> env_pb2.CloseResponse:
        return env_pb2.CloseResponse(closed=self._end(request.episode_id))

    # ---- helpers -------------------------------------------------------------------------

    def _call(self, env, what: str, fn, *args):
        """fn(*args) on the pool within step_timeout; its failure as the status it becomes."""
        future = self.pool.submit(fn, *args)
        try:
            return future.result(timeout=self.cfg.step_timeout)
        except concurrent.futures.TimeoutError:
            self._close(env)  # the call itself runs on: a thread cannot be stopped from outside
            raise Aborted(f"the environment's {what} took longer than --step-timeout {self.cfg.step_timeout:g} s; "
                          "the episode is over") from None
        except ValueError as e:
            self._close(env)
            raise InvalidArgument(f"the environment refused this in {what}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the environment is user code; the service stays up
            log.warning("environment %s failed in %s", self.cfg.env, what, exc_info=True)
            self._close(env)
            raise Aborted(f"the environment failed in {what}: {type(e).__name__}: {e}") from None

    @staticmethod
    def _check_step(out) -> tuple[str, float, bool, dict]:
        if not isinstance(out, tuple) or len(out) != 4:
            raise Aborted("the environment's step must return (observation, reward, done, info), got "
                          f"{type(out).__name__}")
        observation, reward, done, info = out
        if observation is None:
            observation = ""
        if not isinstance(observation, str):
            raise Aborted(f"the environment's step returned a {type(observation).__name__} observation; it "
                          "must be text")
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            raise Aborted(f"the environment's step returned reward {reward!r}, not a number") from None
        if not math.isfinite(reward):
            raise Aborted(f"the environment's step returned reward {reward}")
        return observation, reward, bool(done), info

    @staticmethod
    def _info_json(env, info) -> str:
        if info is None:
            return "{}"
        if not isinstance(info, dict):
            raise Aborted(f"the environment's info must be a dict, got {type(info).__name__}")
        try:
            return json.dumps(info, default=str)
        except (TypeError, ValueError) as e:
            raise Aborted(f"the environment's info cannot be written as JSON: {e}") from None

    def _end(self, episode_id: str) -> bool:
        with self.lock:
            episode = self.episodes.pop(episode_id, None)
            self.finished += episode is not None
        if episode is not None:
            self._close(episode.env)
        return episode is not None

    def _close(self, env) -> None:
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - an episode that fails to clean up is still over
                log.warning("environment %s failed to close an episode", self.cfg.env, exc_info=True)

    def _reap(self) -> None:
        """Close episodes idle past idle_timeout (their caller went away without Close)."""
        cutoff = time.monotonic() - self.cfg.idle_timeout
        with self.lock:
            idle = [k for k, e in self.episodes.items() if e.last_used < cutoff and not e.lock.locked()]
        for k in idle:
            self._end(k)

    def close(self) -> None:
        for k in list(self.episodes):
            self._end(k)
        self.pool.shutdown(wait=False, cancel_futures=True)
