"""The SandboxService: each Run in a new bubblewrap sandbox (services/sandbox/bwrap.py), started ahead of
it where the warm pool has one ready (services/sandbox/warm.py), at most `concurrency` at once, each with
its own user id and, where the machine allows, a cgroup of its own (services/sandbox/cgroups.py); sessions
keep an episode's files between its Runs, in this process's memory. A sandbox leaves nothing on the host
but the service's cgroups (emptied as each Run ends); bubblewrap's --die-with-parent takes a killed
service's sandboxes (the warm ones too) with it, and the next start removes its groups.

A request's limits default to the service's and may not pass its ceilings; a bad request is
INVALID_ARGUMENT naming the field, and nothing a program does ends the service.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import os
import subprocess
import threading
import time
from typing import Any

from meshrl.config.sandbox import SandboxConfig
from meshrl.errors import Aborted, FailedPrecondition, InvalidArgument
from meshrl.flags import settings_json
from meshrl.v1 import common_pb2, sandbox_pb2
from services.sandbox import bwrap, cgroups, reaper, warm

CEILING = 16  # a request may ask up to this many times a default limit (max_wall_s for wall time)
SETTING = {"processes": "process_limit"}  # the setting holding a limit's default, where named otherwise


@dataclasses.dataclass
class Session:
    files: dict[str, bytes]
    used: float
    extras: bwrap.Extras = dataclasses.field(default_factory=bwrap.Extras)  # its files' modes, its links
    size: int = 0  # bytes of its files
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # one Run at a time


class SandboxServicer:
    SERVICE = sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"]

    def __init__(self, cfg: SandboxConfig):
        missing = bwrap.available()
        if missing:
            raise RuntimeError(f"the sandbox service needs bubblewrap: {missing}")
        self.cfg = cfg
        self.root = os.geteuid() == 0  # sandboxes of their own user ids (the process limit is per user)
        self.slots = threading.BoundedSemaphore(cfg.concurrency)
        self.uids = range(cfg.first_uid, cfg.first_uid + cfg.uids)
        self.busy: set[int] = set()  # user ids of the sandboxes running or ready
        self.running = 0  # Runs in a slot
        self.turn = itertools.count()
        if self.root:
            reaper.adopt(self.uids)
        self.cgroups, self.no_cgroups = cgroups.find() if cfg.cgroups else (None, "off (--no-cgroups)")
        if self.cgroups is not None:
            self.cgroups.sweep()
        self.sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
        self.pool: warm.Pool | None = None
        self.self_test()
        if cfg.warm:
            # at the ceilings, which it lowers for each Run, but its mounts' size, which it cannot change after
            at = dataclasses.replace(self.ceilings(), disk_mb=cfg.disk_mb)
            self.pool = warm.Pool(cfg.warm, at, self._hold, self._free, idle=lambda: self.running < cfg.concurrency)

    def self_test(self) -> None:
        """One sandbox at start: where this machine refuses them (no user namespaces: a container's seccomp
        profile, a sysctl) every Run would fail the same way, and its programs would score 0."""
        limits = bwrap.Limits(5.0, 5.0, 256, 16, 1, 1, 4096)
        result = self._in_slot(["true"], {}, b"", limits, False)
        if result.exit_code != 0:
            why = result.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"a sandbox cannot start on this machine (exit code {result.exit_code}): {why}")

    def Describe(self, request, context) -> common_pb2.ServiceInfo:
        return common_pb2.ServiceInfo(
            service="sandbox",
            backend=self.version or "bubblewrap",
            details={
                **{k: str(v) for k, v in sorted(self.counts.items())},
                "sessions": str(len(self.sessions)),
                "own_user_ids": str(self.root).lower(),
                "cgroups": self.cgroups.kind if self.cgroups is not None else f"none: {self.no_cgroups}",
                "warm": f"{self.pool.count() if self.pool is not None else 0} ready of {self.cfg.warm}",
                "settings": settings_json(self.cfg),
            },
        )

    def Run(self, request, context) -> sandbox_pb2.RunResponse:
        limits = self.limits(request.limits)
        argv = list(request.argv)
        if not argv or any(not a or "\0" in a for a in argv):
            raise InvalidArgument("argv must name a program, with no empty argument and no NUL")
        try:
            files = {bwrap.check_path(k): v for k, v in request.files.items()}
        except bwrap.Refused as e:
            raise InvalidArgument(str(e)) from None
        session = self._session(request.session) if request.session else None
        with session.lock if session is not None else contextlib.nullcontext():
            given = {**(session.files if session is not None else {}), **files}
            extras = kept(session, files)
            self.check_files(given, limits)
            back = request.return_files or session is not None
            result = self._in_slot(argv, given, request.stdin, limits, back, context=context, extras=extras)
            if session is not None and result.files is not None and not result.killed:
                self._keep(session, result.files, result.extras)
        self.counts["runs"] += 1
        self.counts[f"killed_{result.killed}"] += bool(result.killed)
        return sandbox_pb2.RunResponse(
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            wall_s=result.wall_s,
            killed=result.killed,
            files=result.files if request.return_files and result.files else {},
            truncated=result.truncated,
        )

    def CloseSession(self, request, context) -> sandbox_pb2.CloseSessionResponse:
        with self.lock:
            return sandbox_pb2.CloseSessionResponse(closed=self.sessions.pop(request.session, None) is not None)

    def close(self) -> None:
        """The service's way out: its warm sandboxes and its cgroups go (run_service calls it once serving
        ends)."""
        if self.pool is not None:
            self.pool.close()
        if self.cgroups is not None:
            self.cgroups.close()

    def limits(self, asked) -> bwrap.Limits:
        """The request's limits: 0 takes the service's default; past a ceiling is INVALID_ARGUMENT."""
        most, out = self.ceilings(), {}
        for f in dataclasses.fields(bwrap.Limits):
            default, ceiling = getattr(self.cfg, SETTING.get(f.name, f.name)), getattr(most, f.name)
            value = getattr(asked, f.name) or default
            if not 0 < value <= ceiling:
                raise InvalidArgument(f"limits.{f.name}={value} must be in (0, {ceiling:g}] (the service's ceiling)")
            out[f.name] = type(default)(value)
        return bwrap.Limits(**out)

    def ceilings(self) -> bwrap.Limits:
        """The most a request may ask of each limit."""
        c, out = self.cfg, dict[str, Any]()
        for f in dataclasses.fields(bwrap.Limits):
            default = getattr(c, SETTING.get(f.name, f.name))
            out[f.name] = c.max_wall_s if f.name == "wall_s" else default * CEILING
        return bwrap.Limits(**out)

    def check_files(self, files: dict[str, bytes], limits: bwrap.Limits) -> None:
        if len(files) > bwrap.MAX_FILES:
            raise InvalidArgument(f"{len(files)} files exceed the {bwrap.MAX_FILES} a Run may carry")
        size = sum(map(len, files.values()))
        if size > limits.disk_mb << 20:
            raise InvalidArgument(f"the files hold {size} bytes, more than limits.disk_mb={limits.disk_mb} MiB")

    def _in_slot(  # limit: a Run's parts
        self, argv, files, stdin: bytes, limits: bwrap.Limits, files_back: bool, *, context=None, extras=None
    ) -> bwrap.Result:
        """Run in a free slot (waiting for one): in a warm sandbox where one is ready for these limits, else
        in a new one."""
        with self.slots, self._counted():
            if context is not None and not context.is_active():  # its caller left while it waited
                raise Aborted("the caller cancelled or its deadline passed before the sandbox started")
            ready = self.pool.take(limits) if self.pool is not None else None
            try:
                result = ready.run(argv, files, stdin, limits, files_back=files_back, extras=extras) if ready else None
            except OSError as e:  # out of file descriptors, memory
                raise FailedPrecondition(f"the sandbox could not start: {e}") from None
            finally:
                if ready is not None and self.pool is not None:
                    self.pool.done(ready)
            self.counts["warm_runs"] += result is not None
            return result if result is not None else self._cold(argv, files, stdin, limits, files_back, extras)

    def _cold(  # limit: a Run's parts
        self, argv, files, stdin: bytes, limits: bwrap.Limits, files_back: bool, extras
    ) -> bwrap.Result:
        """Run in a new sandbox, as a user id of its own where the service is root."""
        uid, group = None, None
        try:
            uid, group = self._hold(limits)
            return bwrap.run(argv, files, stdin, limits, uid, files_back=files_back, group=group, extras=extras)
        except OSError as e:  # the sandbox could not start (out of file descriptors, memory)
            raise FailedPrecondition(f"the sandbox could not start: {e}") from None
        finally:
            self._free(uid, group)

    @contextlib.contextmanager
    def _counted(self):
        with self.lock:
            self.running += 1
        try:
            yield
        finally:
            with self.lock:
                self.running -= 1
            if self.pool is not None:
                self.pool.wake()

    def _hold(self, limits: bwrap.Limits) -> tuple[int | None, cgroups.Group | None]:
        """A sandbox's user id (the next of the ring not running, so a finished sandbox's last process has
        time to be waited for before its id comes round again) and cgroup (at `limits`)."""
        uid = self._uid()
        try:
            place = self.cgroups
            memory, processes = bwrap.group_limits(limits)
            return uid, place.take(memory, processes) if place is not None else None
        except BaseException:
            self._free(uid, None)
            raise

    def _free(self, uid: int | None, group: cgroups.Group | None) -> None:
        if self.cgroups is not None and group is not None:
            self.cgroups.give(group)
        if uid is not None:
            with self.lock:
                self.busy.discard(uid)

    def _uid(self) -> int | None:
        if not self.root:
            return None
        with self.lock:
            while (uid := self.uids[next(self.turn) % len(self.uids)]) in self.busy:
                pass
            self.busy.add(uid)
            return uid

    def _session(self, name: str) -> Session:
        """The session's record (a new one with no files), the idle and least recently used forgotten."""
        now = time.monotonic()
        with self.lock:
            for key in [k for k, s in self.sessions.items() if now - s.used > self.cfg.session_idle_s]:
                del self.sessions[key]
            session = self.sessions.pop(name, None) or Session({}, now)
            self.sessions[name] = session
            while len(self.sessions) > self.cfg.max_sessions:
                self.sessions.popitem(last=False)
            return session

    def _keep(self, session: Session, files: dict[str, bytes], extras: bwrap.Extras) -> None:
        """A session's files after a Run, within --session-mb for all sessions (the least recently used,
        never this one, forgotten first)."""
        now = time.monotonic()
        with self.lock:
            session.files, session.used, session.size = files, now, sum(map(len, files.values()))
            session.extras = extras
            budget = self.cfg.session_mb << 20
            total = sum(s.size for s in self.sessions.values())
            for key in list(self.sessions):
                if total <= budget:
                    break
                if self.sessions[key] is not session:
                    total -= self.sessions.pop(key).size


def kept(session: Session | None, files: dict[str, bytes]) -> bwrap.Extras | None:
    """What a session's /work holds beyond its files' bytes, less what the request's own files replace (a
    file sent again has the default mode; a file sent where a link was replaces the link)."""
    if session is None:
        return None
    modes = {k: v for k, v in session.extras.modes.items() if k not in files}
    return bwrap.Extras(modes, {k: v for k, v in session.extras.links.items() if k not in files})
