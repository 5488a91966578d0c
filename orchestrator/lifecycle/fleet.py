"""The rollout fleet: rollout.replicas services (or the addresses rollout.address lists), each its own
engine, and which of them serves each Generate call.

Replica 0 is the role "rollout" and replica i the role "rollout-i", so a run of one replica names its
service as it always did. The Router gives a call to the replica with the fewest samples in flight among
those up, ties to the lowest index, so that a step that starts with an idle fleet sends the same parts
to the same replicas every time. A sample's seed belongs to its prompt (prompt i of a call samples with
the call's seed + i, and a part of the call that starts at prompt a carries seed + a), and both backends
draw each prompt's samples from streams of their own (vLLM a generator per request, the hf backend
services/rollout/row_sampler.py), so the fleet's size and which replica serves a prompt do not change
what it samples. Only a prompt's logits can differ in the last bits between batches of other sizes or
padding, which moves a sample only where its draw falls that close to a boundary. Multi-turn episodes
are not reproducible either way: which turns share a call depends on the tools' timing.

A replica that fails a call is marked down: its calls go to the others, and it gets work again only
once the run has brought it back and given it the current weights (run.fleet.heal). So is one that hangs:
while another replica is up, a call gets a deadline scaled from its work (Router.deadline: SLACK times
the fleet's slowest recent pace per sample, at least MIN_DEADLINE seconds), and a replica that makes no
answer within it (SIGSTOP, a wedged engine) is set aside and its call sent to another, as if it had died.

A running run's fleet changes through RUN_DIR/fleet.json (`meshrl fleet RUN_DIR --replicas N`, or
`--address A,B,...` for a fleet given by address), read before every step: a new replica starts (or is
reached), is given the current weights and then work; a removed one gets no new calls, its calls in
flight finish, and it is stopped (one the run started) or let go.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import threading
import time

import torch
import torch.nn.functional as F

from meshrl import hosts
from meshrl.algos.router_replay import ROUTED, filler
from meshrl.dataproto import DataProto
from meshrl.layout import VERSIONS
from orchestrator.config import Config

RESPONSE_WIDE = ("rollout_logprobs", "response_mask", VERSIONS)  # (B, T) tensors besides responses: right padded


FLEET_FILE = "fleet.json"


def replica_names(cfg: Config, count: int | None = None) -> list[str]:
    """The fleet's role names: "rollout", then "rollout-1", "rollout-2", ..."""
    return ["rollout", *(f"rollout-{i}" for i in range(1, count or replica_count(cfg)))]


def write_fleet(run_dir: pathlib.Path, replicas: int = 0, address: str = "") -> dict:
    """RUN_DIR/fleet.json, written whole (a run reading it never sees half): the fleet the run should have."""
    if bool(replicas) == bool(address):
        raise ValueError("give the number of replicas the run starts, or the addresses of running ones")
    if replicas < 0:
        raise ValueError(f"replicas={replicas} must be >= 1")
    listed = hosts.address_list(address)
    wanted = {"replicas": replicas} if replicas else {"address": ",".join(listed)}
    tmp = run_dir / f".{FLEET_FILE}.tmp"
    tmp.write_text(json.dumps(wanted) + "\n")
    os.replace(tmp, run_dir / FLEET_FILE)
    return wanted


def read_fleet(run_dir: pathlib.Path) -> dict | None:
    """What RUN_DIR/fleet.json asks for, or None (no file, or one that is not a fleet: said once by the caller)."""
    path = run_dir / FLEET_FILE
    if not path.is_file():
        return None
    try:
        wanted = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return wanted if isinstance(wanted, dict) else None


def replica_count(cfg: Config) -> int:
    given = given_addresses(cfg)
    return len(given) if given else cfg.rollout.replicas


def given_addresses(cfg: Config) -> list[str]:
    """rollout.address as a list: one HOST:PORT, or several separated by commas (a fleet run elsewhere)."""
    return hosts.address_list(cfg.rollout.address)


def replica_address(cfg: Config, name: str) -> str:
    """The address rollout.address gives this replica ("" where the run starts it)."""
    given = given_addresses(cfg)
    return given[replica_index(name)] if given else ""


def replica_index(name: str) -> int:
    return int(name.rsplit("-", 1)[1]) if "-" in name else 0


def role_of(name: str) -> str:
    """The service kind behind a name: "rollout-2" is a rollout."""
    return name.split("-", 1)[0]


def is_replica(name: str) -> bool:
    return role_of(name) == "rollout"


SLACK = 8.0  # a call may take this many times the fleet's slowest recent seconds per sample
MIN_DEADLINE = 10.0  # seconds: never less (a step's long tail, a replica that shares its cores)
PACE_CALLS = 16  # the recent calls the pace is taken over


class Router:
    """Which replica serves a call, how long it may take, and what each served (metrics)."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.in_flight = dict.fromkeys(names, 0)  # samples
        self.down: set[str] = set()
        self.samples = dict.fromkeys(names, 0)  # served since the last metrics()
        self.busy = dict.fromkeys(names, 0.0)  # seconds with a call in flight, since the last metrics()
        self.since: dict[str, float] = {}  # when its current busy spell began
        self.paces: collections.deque[float] = collections.deque(maxlen=PACE_CALLS)  # seconds per sample
        self.warm: set[str] = set()  # replicas past their first call
        self.lock = threading.Lock()

    def deadline(self, samples: int) -> float | None:
        """Seconds a call of `samples` may take before its replica counts as hung; None (the client's own
        deadline) before any call has been timed (an engine's first call compiles and warms up) or when
        no other replica is up to take the call."""
        with self.lock:
            if not self.paces or len(self.names) - len(self.down) < 2:
                return None
            return max(MIN_DEADLINE, SLACK * max(self.paces) * samples)

    def timed(self, name: str, seconds: float, samples: int) -> None:
        """A call of `samples` served by `name` in `seconds`: the fleet's pace. A replica's first call is left
        out: an engine warms up on it (5 s for 8 samples of the tiny test model, 0.1 s after)."""
        with self.lock:
            if name in self.warm:
                self.paces.append(seconds / max(1, samples))
            self.warm.add(name)

    def up(self) -> list[str]:
        with self.lock:
            return [n for n in self.names if n not in self.down]

    def pick(self, samples: int, prefer: str | None = None) -> str:
        """The replica for a call of `samples` samples, counted in flight until done(): `prefer` while it
        is up (a multi-turn episode's, whose prefix it holds), else the least loaded."""
        with self.lock:
            live = [n for n in self.names if n not in self.down]
            if not live:
                raise NoReplica(f"no rollout replica is up (all of {', '.join(self.names)} failed)")
            name = prefer if prefer in live else min(live, key=lambda n: (self.in_flight[n], self.names.index(n)))
            assert name is not None
            if not self.in_flight[name]:
                self.since[name] = time.perf_counter()
            self.in_flight[name] += samples
            return name

    def done(self, name: str, samples: int, served: bool) -> None:
        with self.lock:
            if name not in self.in_flight:  # removed from the fleet while this call ran
                return
            self.in_flight[name] -= samples
            if served:
                self.samples[name] += samples
            if not self.in_flight[name]:
                self.busy[name] += time.perf_counter() - self.since.pop(name)

    def mark_down(self, name: str) -> None:
        with self.lock:
            if name in self.names:
                self.down.add(name)

    def mark_up(self, name: str) -> None:
        with self.lock:
            self.down.discard(name)

    def add(self, name: str) -> None:
        """A new replica, set aside until the run has given it the weights (mark_up)."""
        with self.lock:
            self.names.append(name)
            self.down.add(name)
            self.in_flight[name], self.samples[name], self.busy[name] = 0, 0, 0.0

    def remove(self, name: str, timeout: float = 600) -> bool:
        """Take a replica out: no new calls, and wait (up to `timeout` s) for those in flight; whether they
        all finished."""
        deadline = time.monotonic() + timeout
        with self.lock:
            self.names.remove(name)
            self.down.discard(name)
        while self.in_flight.get(name, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        with self.lock:
            left = self.in_flight.pop(name, 0)
            self.samples.pop(name, None)
            self.busy.pop(name, None)
            self.since.pop(name, None)
            return not left

    def metrics(self, versions: dict[str, int]) -> dict[str, float]:
        """Per replica since the last call: samples, samples/s while busy, calls' samples in flight now, and
        the weight version it holds; rollout/replicas_up."""
        out: dict[str, float] = {}
        with self.lock:
            now = time.perf_counter()
            for name in self.names:
                busy = self.busy[name] + (now - self.since[name] if name in self.since else 0.0)
                if name in self.since:
                    self.since[name] = now
                key = f"rollout/replica{replica_index(name)}"
                out[f"{key}/samples"] = float(self.samples[name])
                out[f"{key}/samples_per_s"] = self.samples[name] / busy if busy > 0 else 0.0
                out[f"{key}/in_flight"] = float(self.in_flight[name])
                out[f"{key}/weight_version"] = float(versions.get(name, -1))
                self.samples[name], self.busy[name] = 0, 0.0
            out["rollout/replicas_up"] = float(len(self.names) - len(self.down))
        return out


class NoReplica(RuntimeError):
    """Every replica of the fleet is down."""


def starts(rows: int, parts: int) -> list[int]:
    """Where each of (at most) `parts` near-equal consecutive parts of `rows` prompts begins."""
    parts = max(1, min(parts, rows))
    return [i * rows // parts for i in range(parts)]


def join_generations(parts: list[DataProto]) -> DataProto:
    """Generate replies of consecutive prompts as one: prompts left padded, responses right padded to the
    widest, and the oldest weight version of the parts."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.batch["prompts"].shape[1] for p in parts)
    T = max(p.batch["responses"].shape[1] for p in parts)
    version = min(q.meta_info.get("weight_version", 0) for q in parts)
    padded = []
    for p in parts:
        b, pad = p.batch, p.meta_info.get("pad_token_id", 0)
        left, right = P - b["prompts"].shape[1], T - b["responses"].shape[1]
        width = b["prompts"].shape[1]
        prompts = F.pad(b["prompts"], (left, 0), value=pad)
        responses = F.pad(b["responses"], (0, right), value=pad)
        mask = torch.cat(
            [F.pad(b["attention_mask"][:, :width], (left, 0)), F.pad(b["attention_mask"][:, width:], (0, right))], 1
        )
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            **{k: F.pad(b[k], (0, right)) for k in RESPONSE_WIDE if k in b},
        }
        if ROUTED in b:  # beside input_ids: filler where the prompt and response padding grew
            r = b[ROUTED]
            tensors[ROUTED] = torch.cat(
                [
                    filler((len(r), left, r.shape[2]), r.shape[3]).to(r.dtype),
                    r,
                    filler((len(r), right, r.shape[2]), r.shape[3]).to(r.dtype),
                ],
                1,
            )
        unknown = set(b) - set(tensors)
        if unknown:
            raise ValueError(f"the rollout replied with tensors {sorted(unknown)} that cannot be joined")
        padded.append(DataProto(tensors, p.non_tensor_batch, {**p.meta_info, "weight_version": version}))
    return DataProto.concat(padded)
