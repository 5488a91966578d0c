"""One program run in a bubblewrap sandbox: the command line that isolates it, its limits, its files in and
out, and its output read up to a cap. services/sandbox/servicer.py keeps the slots and sessions around it.

Why bubblewrap (Debian's `bubblewrap`, the tool Flatpak runs every application in): it isolates with the
kernel's namespaces and needs no daemon, so a sandbox starts in milliseconds on any Linux machine, where a
container engine needs a daemon and starts one in hundreds (bench/RESULTS.md, "Sandboxes"). Each Run is a
new sandbox:

- namespaces of its own for users, processes, network (nothing but its own loopback: no host, no
  127.0.0.1 of the machine), IPC, host name and cgroups; no nested user namespaces; its own session (no
  terminal to type into); killed with everything in it when the service dies (--die-with-parent);
- a file system of the system's programs and libraries (/usr, /bin, /lib), a fresh /proc and /dev, all
  read-only, and /work, /tmp and /dev/shm as memory-backed file systems of disk_mb each: nothing of the
  host's files, the run's folder or its token; its input files copied in (bubblewrap's --file), its files
  read back out of /work as a tar stream written after the program ends (by the sandbox's own shell: what
  comes back is no more than the program itself could have written);
- no environment but PATH, HOME=/work and LANG;
- kernel limits set before it starts (prlimit): CPU seconds, address space, file size, open files and no
  core files per process, and processes per user. Run as root (as the service is in its image), each
  sandbox is its own user id, so the process limit is the sandbox's own; otherwise it would count all the
  user's processes, and is not set;
- where the machine lets the service make cgroups, a cgroup of its own (services/sandbox/cgroups.py):
  the sandbox's memory as a whole and its processes, whoever runs the service.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pathlib
import shutil
import signal
import subprocess
import tarfile
import threading
import time

from services.sandbox import cgroups, reaper

SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc/alternatives")  # read-only where they exist
PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_FILES = 1000  # files in or out of one Run
MAX_PATH = 1024  # characters of a file's path: every path is on bubblewrap's command line


OWN_PROCESSES = 3  # a sandbox's own beside its program's: bubblewrap, the sandbox's init, its shell


class Refused(ValueError):
    """A request the sandbox cannot take as it is (the message says which field)."""


@dataclasses.dataclass
class Limits:
    wall_s: float
    cpu_s: float
    memory_mb: int
    processes: int
    file_mb: int
    disk_mb: int
    output_bytes: int


@dataclasses.dataclass
class Extras:
    """What /work holds beyond its files' bytes, which a session keeps between its Runs: each file's
    permission bits (an executable stays one) and the symbolic links (name -> target)."""

    modes: dict[str, int] = dataclasses.field(default_factory=dict)
    links: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Result:
    exit_code: int  # 128 + N: signal N ended the program (as a shell says); -9: the sandbox was stopped
    stdout: bytes
    stderr: bytes
    wall_s: float
    killed: str = ""  # "wall", "output" or "memory" (its cgroup's limit): the sandbox stopped it
    truncated: bool = False
    files: dict[str, bytes] | None = None  # /work's after the run, when asked for
    extras: Extras = dataclasses.field(default_factory=Extras)  # with files: their modes, /work's links


def group_limits(limits: Limits) -> tuple[int, int]:
    """A sandbox's cgroup limits: bytes for its programs and its three memory-backed mounts, processes."""
    return (limits.memory_mb + 3 * limits.disk_mb) << 20, limits.processes + OWN_PROCESSES


def available() -> str:
    """ "" where bubblewrap and prlimit are installed, else what to install."""
    missing = [t for t in ("bwrap", "prlimit", "setpriv") if shutil.which(t) is None]
    return f"{', '.join(missing)} not found: apt-get install bubblewrap util-linux" if missing else ""


def check_path(name: str) -> str:
    """A file's path under /work: relative, no `..`, no empty parts; Refused otherwise."""
    parts = pathlib.PurePosixPath(name).parts
    if not parts or name.startswith("/") or "\0" in name or any(p in ("..", ".") for p in parts):
        raise Refused(f"files: {name[:80]!r} must be a relative path inside /work (no '..')")
    if len(name) > MAX_PATH or max(len(p) for p in parts) > 255:
        raise Refused(f"files: {name[:80]!r}... is longer than {MAX_PATH} characters (or a part than 255)")
    return "/".join(parts)


# joins the cgroups named before "--" (cgroup.procs files), then becomes the command after it: everything
# the sandbox starts is in them from its first instruction
JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def command(  # limit: the sandbox's parts
    argv: list[str],
    limits: Limits,
    files: dict[str, int],
    out_fd: int | None,
    uid: int | None,
    join: list[str],
    *,
    extras: Extras | None = None,
) -> list[str]:
    """The command line: the sandbox's cgroups joined (join: their cgroup.procs files), the slot's user
    (setpriv, where the service is root), prlimit's limits, then bubblewrap's sandbox around a shell that
    runs argv in /work (and, with out_fd, writes /work as a tar stream to it after). Tools rather than
    Popen's user= or a preexec_fn: those make Python fork the service's process, whose gRPC threads' fork
    handlers can crash the child before it runs anything."""
    line = sandbox(limits, uid, join, nofile=max(256, len(files) + 64))  # the input files come in open
    extras = extras or Extras()
    for d in sorted({str(pathlib.PurePosixPath(n).parent) for n in [*files, *extras.links]} - {"."}):
        line += ["--dir", f"/work/{d}"]
    for name, fd in files.items():
        if name in extras.modes:
            line += ["--perms", f"{extras.modes[name] & 0o777:04o}"]
        line += ["--file", str(fd), f"/work/{name}"]
    for name, target in extras.links.items():
        line += ["--symlink", target, f"/work/{name}"]
    # bubblewrap's root and /dev are memory-backed and unsized: read-only, the sized mounts above stay writable
    line += READ_ONLY
    if out_fd is None:
        return [*line, "--", *argv]  # bubblewrap runs it itself, found on PATH
    # the program gets no copy of the stream's pipe; the shell writes /work to it once the program ends
    # (bash: dash takes no file descriptor past 9 in a redirection)
    script = f'unset SHLVL; "$@" {out_fd}>&-; s=$?; tar -cf - . >&{out_fd} 2>/dev/null; exit $s'
    return [*line, "/bin/bash", "-c", script, "bash", *argv]


READ_ONLY = ["--remount-ro", "/dev", "--remount-ro", "/"]


def sandbox(limits: Limits, uid: int | None, join: list[str], *, nofile: int | None) -> list[str]:
    """The command line up to bubblewrap's mounts of /work (the caller adds its files and READ_ONLY): the
    cgroups joined, the user, prlimit's limits (none with nofile None: a warm sandbox's launcher sets the
    Run's itself), and bubblewrap's namespaces and file system."""
    size = str(limits.disk_mb << 20)
    line = ["/bin/sh", "-c", JOIN, "sh", *join, "--"] if join else []
    line += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
    if nofile is not None:
        cpu = math.ceil(limits.cpu_s)  # SIGXCPU at the soft limit, SIGKILL a second later for one that ignores it
        line += ["prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={limits.memory_mb << 20}"]
        line += [f"--fsize={limits.file_mb << 20}", f"--nofile={nofile}", "--core=0"]
        line += [*([f"--nproc={limits.processes}"] if uid is not None else []), "--"]
    line += [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]
    for path in SYSTEM:
        line += ["--ro-bind-try", path, path]
    line += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm"]
    line += ["--size", size, "--tmpfs", "/work", "--size", size, "--tmpfs", "/tmp"]
    line += ["--setenv", "PATH", PATH, "--setenv", "HOME", "/work", "--setenv", "LANG", "C.UTF-8"]
    return line + ["--hostname", "sandbox", "--chdir", "/work"]


def memfds(files: dict[str, bytes]) -> dict[str, int]:
    """Each file's bytes in an anonymous memory file, read from the start by bubblewrap's --file."""
    fds = {}
    try:
        for name, body in files.items():
            fd = fds[name] = os.memfd_create("in", 0)
            write_all(fd, body)
            os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def write_all(fd: int, body: bytes) -> None:
    view = memoryview(body)
    while view:
        view = view[os.write(fd, view) :]


class Capped:
    """A pipe read to its end on a thread, keeping up to `cap` bytes; past it, `over` is set and on_over
    runs (the run is stopped: a program writing without end must not hold the sandbox)."""

    def __init__(self, fd: int, cap: int, on_over):
        self.fd, self.cap, self.on_over = fd, cap, on_over
        self.chunks: list[bytes] = []
        self.size, self.over = 0, False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with os.fdopen(self.fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                keep = chunk[: max(0, self.cap - self.size)]
                self.chunks.append(keep)
                self.size += len(keep)
                if len(keep) < len(chunk) and not self.over:
                    self.over = True
                    self.on_over()

    def value(self, timeout: float) -> bytes:
        self.thread.join(timeout)
        return b"".join(self.chunks)


def run(  # limit: the sandbox's parts
    argv: list[str],
    files: dict[str, bytes],
    stdin: bytes,
    limits: Limits,
    uid: int | None,
    *,
    files_back: bool,
    group: cgroups.Group | None = None,
    extras: Extras | None = None,
) -> Result:
    """Run argv in a new sandbox (as user `uid` where the service is root, in `group` where given: its
    caller removes it after), /work holding `files` with `extras` (their modes, links); the Result."""
    out_r, out_w = os.pipe() if files_back else (None, None)
    fds: dict[str, int] = {}
    start = time.monotonic()
    try:
        fds = memfds(files)
        line = command(argv, limits, fds, out_w, uid, group.procs if group is not None else [], extras=extras)
        proc = spawn(line, (*fds.values(), *([out_w] if out_w is not None else [])))
    except BaseException:
        if out_r is not None:
            os.close(out_r)
        raise
    finally:
        for fd in (*fds.values(), *([out_w] if out_w is not None else [])):
            os.close(fd)
    return finish(proc, stdin, limits, start, out_r, group)


def spawn(line: list[str], pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """A sandbox's command line started, its pid the service's to wait for (the reaper passes over it)."""
    with reaper.lock:  # its pid is ours to wait for before the reaper looks again
        proc = subprocess.Popen(
            line,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            start_new_session=True,  # a group of its own: the kill takes bubblewrap and so the sandbox
        )
        reaper.running.add(proc.pid)
    return proc


def finish(  # limit: a sandbox's parts
    proc: subprocess.Popen, stdin: bytes, limits: Limits, start: float, out_r: int | None, group: cgroups.Group | None
) -> Result:
    """The started sandbox's Result (_finish), "memory" where its cgroup's limit ended a process."""
    result = _finish(proc, stdin, limits, start, out_r)
    if group is not None and not result.killed and group.out_of_memory():
        result.killed, result.files = "memory", {} if result.files is not None else None
    return result


def _finish(proc: subprocess.Popen, stdin: bytes, limits: Limits, start: float, out_r: int | None) -> Result:
    """Feed stdin, read the outputs with their caps, stop it at its wall time; the Result."""
    killed: list[str] = []

    def stop(why: str) -> None:
        killed.append(why)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out = Capped(os.dup(proc.stdout.fileno()), limits.output_bytes, lambda: stop("output"))
    err = Capped(os.dup(proc.stderr.fileno()), limits.output_bytes, lambda: stop("output"))
    tar = Capped(out_r, (limits.disk_mb << 20) + (1 << 20), lambda: None) if out_r is not None else None
    proc.stdout.close()
    proc.stderr.close()
    threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    # a timer rather than wait(timeout): that polls with sleeps of up to 50 ms, ~13 ms late a Run here
    timer = threading.Timer(limits.wall_s, lambda: None if proc.returncode is not None else stop("wall"))
    timer.start()
    proc.wait()
    timer.cancel()
    reaper.running.discard(proc.pid)
    wall = time.monotonic() - start
    result = Result(proc.returncode, out.value(5.0), err.value(5.0), wall, killed[0] if killed else "")
    result.truncated = out.over or err.over
    if tar is not None:
        result.files, result.extras = unpack(tar.value(5.0)) if not killed else ({}, Extras())
    return result


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):  # it did not read it all: its business
        pass


def unpack(stream: bytes) -> tuple[dict[str, bytes], Extras]:
    """The regular files of a tar stream by relative path, with their modes and the stream's symbolic links
    (at most MAX_FILES of both); nothing for a broken stream. A name or link target that could not come
    back in (not UTF-8, outside /work, too long) is left out."""
    files: dict[str, bytes] = {}
    extras = Extras()
    try:
        with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if len(files) + len(extras.links) >= MAX_FILES or not (member.isfile() or member.issym()):
                    continue  # directories come back as their files' folders
                if not fits(name):
                    continue
                if member.isfile():
                    reader = tar.extractfile(member)
                    if reader is not None:
                        files[name] = reader.read()
                        extras.modes[name] = member.mode & 0o777
                elif member.issym() and member.linkname and "\0" not in member.linkname and readable(member.linkname):
                    if len(member.linkname) <= MAX_PATH:
                        extras.links[name] = member.linkname
    except tarfile.TarError:
        return {}, Extras()
    return files, extras


def fits(name: str) -> bool:
    """A name check_path takes and protobuf can carry."""
    try:
        check_path(name)
    except Refused:
        return False
    return readable(name)


def readable(name: str) -> bool:
    """A name protobuf can carry (UTF-8): a program may write others, which are left out."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
