"""Warm sandboxes: started ahead of their Runs, each waiting for one program, and the pool that keeps them.

A cold Run starts its sandbox when it arrives (bwrap.run): its cgroup joined, its user, its limits,
bubblewrap's namespaces and mounts, all before the program's first instruction. A warm sandbox has done that
already and waits in a launcher (bash, in /work) reading its request from a pipe: the limits to lower to,
whether /work comes back, the argv, then the files as a tar stream (their modes and links come with them).
It then runs the program as a cold sandbox would. Each is used once, so a warm Run is as clean as a cold
one: one program in a sandbox no program used before, then gone.

A warm sandbox starts with its cgroup at the ceilings a request may ask and no process limits of its own
(nothing runs in it but the launcher, which is ours); before the program runs, the launcher sets the process
limits to the request's (ulimit) and the service lowers its cgroup's. The memory-backed mounts' size cannot
change once made, so the pool serves the Runs of the service's disk_mb; a Run that asks another runs cold,
as does any Run while the pool is empty.

The pool keeps SandboxConfig.warm sandboxes ready and starts them one at a time on a thread of its own (a
cap on starts), and only while a slot of the service is free: a sandbox's start costs as much CPU ahead of
its Run as in it (a little more: the launcher), so it never starts one beside a full set of running
programs; in a burst it refills between Runs (bench/RESULTS.md, "Sandboxes": ~6% under cold). A sandbox
found dead when taken, or gone before it read its request, is dropped and its Run goes cold (the program
never started there); three in a row turn the pool off with a warning that says why.
"""

from __future__ import annotations

import io
import logging
import math
import os
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable

from services.sandbox import bwrap, cgroups, reaper

log = logging.getLogger(__name__)
FAILURES = 3  # dead warm sandboxes in a row that turn the pool off

# the launcher's request, from the pipe named by $1: NUL-ended fields (FIELDS, then argc arguments), then
# the files' tar stream where `files` is 1; /work goes back as a tar stream to $2 where `back` is 1
FIELDS = ("back", "cpu", "mem", "fsize", "nofile", "nproc", "files", "argc")
LAUNCHER = f"""
ctrl=$1 out=$2
for k in {" ".join(FIELDS)}; do IFS= read -r -d '' -u "$ctrl" "$k" || exit 125; done
args=(env -u SHLVL -u _)  # the program's environment is a cold sandbox's: PATH, HOME, LANG and PWD
for ((i = 0; i < argc; i++)); do IFS= read -r -d '' -u "$ctrl" a || exit 125; args+=("$a"); done
if [ "$files" = 1 ]; then tar -xpf - --no-same-owner <&"$ctrl" || exit 125; fi
exec {{ctrl}}<&-
ulimit -c 0 -n "$nofile" -f "$fsize" -v "$mem" && ulimit -S -t "$cpu" && ulimit -H -t $((cpu + 1)) || exit 125
if [ -n "$nproc" ]; then ulimit -u "$nproc" || exit 125; fi
if [ "$back" = 1 ]; then "${{args[@]}}" {{out}}>&-; s=$?; tar -cf - . >&"$out" 2>/dev/null; exit $s; fi
exec {{out}}>&-
exec "${{args[@]}}"
"""


class Warm:
    """One started sandbox waiting for its program: its process, the request's pipe and /work's way back."""

    def __init__(self, limits: bwrap.Limits, uid: int | None, group: cgroups.Group | None):
        self.uid, self.group = uid, group
        ctrl_r, self.ctrl = os.pipe()
        self.out, out_w = os.pipe()
        # no process limits until the launcher sets the Run's (before that nothing runs but it): prlimit spared
        line = bwrap.sandbox(limits, uid, group.procs if group is not None else [], nofile=None)
        line += [*bwrap.READ_ONLY, "/bin/bash", "-c", LAUNCHER, "bash", str(ctrl_r), str(out_w)]
        try:
            self.proc = bwrap.spawn(line, (ctrl_r, out_w))
        except BaseException:
            os.close(self.ctrl)
            os.close(self.out)
            raise
        finally:
            os.close(ctrl_r)
            os.close(out_w)

    def run(  # limit: a Run's parts
        self, argv, files, stdin: bytes, limits: bwrap.Limits, *, files_back: bool, extras=None
    ) -> bwrap.Result | None:
        """The Run in this sandbox; None where the sandbox was gone before it read the request (its program
        never started: the caller runs it cold)."""
        start = time.monotonic()
        try:
            if self.group is not None:
                self.group.limit(*bwrap.group_limits(limits))
            bwrap.write_all(self.ctrl, request(argv, files, limits, files_back, extras or bwrap.Extras(), self.uid))
        except OSError as e:  # gone (BrokenPipeError), or its cgroup refused the lower limits
            log.debug("a warm sandbox could not take its Run (%s): the Run goes cold", e)
            self.discard()
            return None
        finally:
            self._close("ctrl")
        out, self.out = self.out, -1  # finish reads it to its end and closes it
        if not files_back:
            os.close(out)
        return bwrap.finish(self.proc, stdin, limits, start, out if files_back else None, self.group)

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd >= 0:
            setattr(self, name, -1)
            os.close(fd)

    def discard(self) -> str:
        """Kill it unused (the pool's close, a dead one); what it said on stderr, for the log."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            _, err = self.proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            err = b""
        reaper.running.discard(self.proc.pid)
        self._close("ctrl")
        self._close("out")
        return (err or b"").decode(errors="replace").strip()[-300:]


def request(  # limit: a request's parts
    argv: list[str], files: dict[str, bytes], limits: bwrap.Limits, back: bool, extras: bwrap.Extras, uid
) -> bytes:
    """What the launcher reads: the fields, the arguments, then the files as a tar stream."""
    nproc = str(limits.processes) if uid is not None else ""  # per user: only where each sandbox has its own
    nofile = max(256, len(files) + 64)  # as a cold sandbox's, whose files come in open
    has_files = bool(files or extras.links)
    fields = [int(back), math.ceil(limits.cpu_s), limits.memory_mb << 10, limits.file_mb << 10, nofile, nproc]
    fields += [int(has_files), len(argv), *argv]
    head = b"".join(str(f).encode() + b"\0" for f in fields)
    return head + (tar_stream(files, extras) if has_files else b"")


def tar_stream(files: dict[str, bytes], extras: bwrap.Extras) -> bytes:
    """/work's files (mode 666 unless extras say otherwise, as bubblewrap's --file makes them) and links."""
    buf, now = io.BytesIO(), time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(body), extras.modes.get(name, 0o666), now
            tar.addfile(info, io.BytesIO(body))
        for name, target in extras.links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, now
            tar.addfile(info)
    return buf.getvalue()


class Pool:
    """`size` warm sandboxes at `limits` (the ceilings), refilled on a thread while idle() says the service
    has room; acquire(limits) -> (uid, group) and release(uid, group) are the service's, for the user ids
    and cgroups the sandboxes hold."""

    def __init__(
        self,
        size: int,
        limits: bwrap.Limits,
        acquire: Callable[[bwrap.Limits], tuple[int | None, cgroups.Group | None]],
        release: Callable[[int | None, cgroups.Group | None], None],
        idle: Callable[[], bool] = lambda: True,
    ):
        self.size, self.limits, self.acquire, self.release = size, limits, acquire, release
        self.idle = idle
        self.ready: list[Warm] = []
        self.cond = threading.Condition()
        self.closed, self.dead = False, 0  # dead: warm sandboxes found dead in a row
        self.thread = threading.Thread(target=self._fill, name="meshrl-sandbox-pool", daemon=True)
        self.thread.start()

    def take(self, limits: bwrap.Limits) -> Warm | None:
        """A ready sandbox for a Run of these limits (None: none ready, or its mounts' size differs); the
        caller gives it back with done() after its Run."""
        if limits.disk_mb != self.limits.disk_mb:
            return None
        while True:
            with self.cond:
                if not self.ready:
                    return None
                warm = self.ready.pop(0)
                self.cond.notify_all()
            if warm.proc.poll() is None:
                self.dead = 0
                return warm
            self._dead(warm)

    def done(self, warm: Warm) -> None:
        self.release(warm.uid, warm.group)

    def wake(self) -> None:
        """The service may have room now (a Run left its slot): a refill waiting for it looks again."""
        with self.cond:
            self.cond.notify_all()

    def count(self) -> int:
        with self.cond:
            return len(self.ready)

    def uids(self) -> set[int | None]:
        """The user ids the ready sandboxes hold."""
        with self.cond:
            return {w.uid for w in self.ready}

    def close(self) -> None:
        """Stop refilling and kill the ready sandboxes (a Run in one goes on to its end)."""
        with self.cond:
            self.closed = True
            ready, self.ready = self.ready, []
            self.cond.notify_all()
        self.thread.join(30)
        for warm in ready:
            warm.discard()
            self.done(warm)

    def _dead(self, warm: Warm) -> None:
        said = warm.discard()
        self.done(warm)
        self.dead += 1
        if self.dead >= FAILURES:
            log.warning("%d warm sandboxes died before their Runs; every Run starts its own now: %s", self.dead, said)
            with self.cond:
                self.size = 0

    def _fill(self) -> None:
        while True:
            with self.cond:  # woken by take(), close() and the service's wake() as a Run leaves its slot
                while not (self.closed or (len(self.ready) < self.size and self.idle())):
                    self.cond.wait()
                if self.closed:
                    return
            uid, group = None, None
            try:
                uid, group = self.acquire(self.limits)
                warm = Warm(self.limits, uid, group)
            except OSError as e:  # out of descriptors, processes or memory: a Run starts its own meanwhile
                self.release(uid, group)
                log.warning("a warm sandbox could not start: %s", e)
                time.sleep(1.0)
                continue
            with self.cond:
                if not self.closed:
                    self.ready.append(warm)
                    continue
            warm.discard()
            self.done(warm)
