"""A cgroup per sandbox: its memory as a whole and its number of processes. The per-process limits
(prlimit) bound each process alone, so a program that forks could hold the process limit times the memory
limit, plus what it writes to its memory-backed mounts; and the process limit counts per user, so it is
only set where the service is root and gives each sandbox a user id of its own. A cgroup bounds the
sandbox itself: `memory` for its programs and the files of its /work, /tmp and /dev/shm (tmpfs pages are
charged to the group that wrote them), no swap, and `pids` for its processes, whoever runs the service.

Made under this process's own cgroup (a sandbox's use stays inside the service's), named after the
service's pid, and reused: a Run takes a free group that is empty (its limits set for that Run), and gives
it back with whatever is left in it killed, so there are about as many as Runs at once. A new memory
group for every Run added ~5 ms to a trivial program's start here, a reused one nothing. Joining a group
still costs a Run ~7 ms (bench/RESULTS.md "Sandboxes"): moving the sandbox's first process even into the
service's own group costs as much, so it is the move, not the group (why, not found); the setting
SandboxConfig.cgroups=false (--no-cgroups) saves it.

The groups live in the v1 hierarchies of `memory` and `pids` where they are mounted and writable, or in
cgroup v2 where this process's group already delegates both controllers to its children (its
cgroup.subtree_control lists them; not the case on this project's machines, so that path is not run by
the tests here). Where neither is writable, find() says why and sandboxes run with their per-process
limits only (Describe reports which). The groups a killed service left (its pid gone) are removed by the
next start, a stopped service's by its close().
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import re
import signal
import threading
import time

from meshrl import lifeline

PREFIX = "meshrl-sandbox-"
CONTROLLERS = ("memory", "pids")
ROOT = pathlib.Path("/sys/fs/cgroup")
NAMES = itertools.count()  # per process: every service in it names its groups apart
MAX_FREE = 64  # groups not yet empty, past which one is removed (its processes will not die)


@dataclasses.dataclass
class Group:
    """One sandbox's cgroup: a folder per hierarchy (one for v2)."""

    dirs: list[pathlib.Path]
    v2: bool
    kills: int = 0  # the kernel's count of processes it ended for memory when the Run began

    @property
    def procs(self) -> list[str]:
        """The cgroup.procs files a process writes its pid to, to join."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def out_of_memory(self) -> bool:
        """Whether the kernel ended a process of the group for its memory limit since the Run began."""
        return self.oom_kills() > self.kills

    def oom_kills(self) -> int:
        events = self.dirs[0] / ("memory.events" if self.v2 else "memory.oom_control")
        try:
            found = re.search(r"^oom_kill (\d+)$", events.read_text(), re.M)
        except OSError:
            return 0
        return int(found.group(1)) if found else 0

    def limit(self, memory_bytes: int, processes: int) -> None:
        """At most `memory_bytes` (no swap) and `processes` processes; OSError where the kernel refuses."""
        if self.v2:
            settings = {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": processes}
        else:  # memsw (with swap accounting on) may never be below the limit: set in the order that keeps it
            memsw = "memory.memsw.limit_in_bytes"
            order = ["memory.limit_in_bytes", memsw] if self._below(memory_bytes) else [memsw, "memory.limit_in_bytes"]
            settings = {**dict.fromkeys(order, memory_bytes), "pids.max": processes}
        for file, value in settings.items():
            for d in self.dirs:
                if (d / file).exists():
                    (d / file).write_text(str(value))
        self.kills = self.oom_kills()

    def _below(self, memory_bytes: int) -> bool:
        try:
            return memory_bytes < int((self.dirs[0] / "memory.limit_in_bytes").read_text())
        except (OSError, ValueError):
            return True

    def empty(self) -> bool:
        return not any(_procs(d) for d in self.dirs)

    def kill(self) -> None:
        for d in self.dirs:
            for pid in _procs(d):
                _kill(pid)

    def remove(self, patience: float = 2.0) -> bool:
        """Kill what is left in the group and remove it; False where it stayed (the next start sweeps it)."""
        return all(_remove(d, patience) for d in self.dirs)


class Cgroups:
    """Where this service makes its sandboxes' groups."""

    def __init__(self, parents: list[pathlib.Path], v2: bool):
        self.parents, self.v2 = parents, v2
        self.free: list[Group] = []
        self.lock = threading.Lock()

    @property
    def kind(self) -> str:
        return "v2" if self.v2 else "v1"

    def take(self, memory_bytes: int, processes: int) -> Group:
        """A free group that is empty (a new one where none is), at these limits; OSError if none can be had."""
        with self.lock:
            group = next((g for g in self.free if g.empty()), None)
            if group is not None:
                self.free.remove(group)
        if group is not None:
            try:
                group.limit(memory_bytes, processes)
                return group
            except OSError:  # e.g. a limit below what the group still holds: a new one instead
                group.remove(0.5)
        return self.make(memory_bytes, processes)

    def give(self, group: Group) -> None:
        """A Run's group back, whatever is left in it killed without waiting (a sandbox's last process
        may end just after the Run: take() passes over a group until it is empty)."""
        group.kill()
        with self.lock:
            self.free.append(group)
            stuck = [g for g in self.free if not g.empty()][MAX_FREE:]
        for g in stuck:  # more held up than Runs ever run at once: something will not die
            if g.remove(0.0):
                with self.lock:
                    self.free.remove(g)

    def close(self) -> None:
        """Remove the free groups (a service's way out; the Runs in flight give theirs back after)."""
        with self.lock:
            free, self.free = self.free, []
        for group in free:
            group.remove(0.5)

    def make(self, memory_bytes: int, processes: int) -> Group:
        """A new group at these limits; OSError if it cannot be made."""
        name = f"{PREFIX}{os.getpid()}-{next(NAMES)}"
        group = Group([p / name for p in self.parents], self.v2)
        try:
            for d in group.dirs:
                d.mkdir()
            group.limit(memory_bytes, processes)
        except OSError:
            group.remove(0.0)
            raise
        return group

    def sweep(self) -> int:
        """Remove the groups that services no longer running left; how many."""
        removed = 0
        for parent in self.parents:
            for d in parent.glob(f"{PREFIX}*"):
                owner = d.name.removeprefix(PREFIX).split("-", 1)[0]
                if owner.isdigit() and not lifeline.running(int(owner)) and _remove(d, 1.0):
                    removed += 1
        return removed


def find() -> tuple[Cgroups | None, str]:
    """This machine's place for sandbox groups, and "" (or, with None, why there is none)."""
    own = _own_paths()
    v1 = [ROOT / c / own.get(c, "/").lstrip("/") for c in CONTROLLERS]
    if all((p / "cgroup.procs").exists() for p in v1):
        return _writable(Cgroups(v1, False))
    unified = next((ROOT / m for m in ("", "unified") if (ROOT / m / "cgroup.subtree_control").exists()), None)
    if unified is not None:
        parent = unified / own.get("", "/").lstrip("/")
        try:
            delegated = set((parent / "cgroup.subtree_control").read_text().split())
        except OSError:
            delegated = set()
        if set(CONTROLLERS) <= delegated:
            return _writable(Cgroups([parent], True))
        return None, f"cgroup v2 at {parent} does not delegate {' and '.join(CONTROLLERS)} to its children"
    return None, f"no cgroup hierarchy of {' and '.join(CONTROLLERS)} under {ROOT}"


def _writable(cgroups: Cgroups) -> tuple[Cgroups | None, str]:
    """The place, once a group can be made and removed there (the service may lack the right)."""
    try:
        cgroups.make(64 << 20, 4).remove(1.0)
    except OSError as e:
        return None, f"cannot make a cgroup under {cgroups.parents[0]}: {e.strerror or e}"
    return cgroups, ""


def _own_paths() -> dict[str, str]:
    """This process's cgroup in each hierarchy: controller -> path ("" for v2's unified one)."""
    paths: dict[str, str] = {}
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path
    return paths


def _procs(d: pathlib.Path) -> list[int]:
    try:
        return [int(pid) for pid in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _remove(d: pathlib.Path, patience: float) -> bool:
    deadline = time.monotonic() + patience
    while True:
        try:
            for pid in _procs(d):
                _kill(pid)
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
