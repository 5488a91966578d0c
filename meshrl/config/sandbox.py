"""The sandbox service's settings: each Run's default limits and the ceilings a request may ask up to, how
many run at once, and where the programs come from (services/sandbox)."""

import dataclasses

from meshrl.config.checked import Checked, require


@dataclasses.dataclass
class SandboxConfig(Checked):
    concurrency: int = 8
    """Sandboxes running at once (each its own user id); a Run beyond them waits for one to end."""
    warm: int = 4
    """Sandboxes kept started and waiting for a program, so that a Run skips the sandbox's start (its
    namespaces, mounts, user and cgroup); started one at a time, each used by one Run. They serve the Runs
    of the default disk_mb; 0: every Run starts its own."""
    wall_s: float = 10.0
    """A Run's wall-clock limit when its request sets none (RunRequest.limits.wall_s)."""
    cpu_s: float = 10.0
    """CPU seconds per process when the request sets none."""
    memory_mb: int = 1024
    """Address space per process, MiB, when the request sets none."""
    process_limit: int = 32
    """Processes and threads a sandbox may run at once, when the request sets none (limits.processes)."""
    file_mb: int = 16
    """The largest file a sandbox may write, MiB, when the request sets none."""
    disk_mb: int = 64
    """What a sandbox may write in /work, and in /tmp and /dev/shm, each a memory-backed file system of this
    size (MiB), when the request sets none; the rest of its file system is read-only. A session's kept files
    count against /work's."""
    output_bytes: int = 1 << 20
    """stdout and stderr kept, each, when the request sets none; a program writing more is stopped."""
    max_wall_s: float = 600.0
    """The most wall_s a request may ask for; the other ceilings are 16x their defaults."""
    max_sessions: int = 4096
    """Sessions (RunRequest.session) whose files are kept at once; the least recently used goes first."""
    session_mb: int = 2048
    """All sessions' kept files together, MiB, in the service's memory; past it the least recently used
    sessions are forgotten first."""
    session_idle_s: float = 3600.0
    """A session not used for this long is forgotten."""
    first_uid: int = 61000
    """Where the service is root, each sandbox runs as its own user id, the next free one of first_uid ..
    first_uid + uids - 1 (no such user needs to exist): the process-count limit is per user."""
    uids: int = 1024
    """User ids in that ring (at least concurrency + warm)."""
    cgroups: bool = True
    """A cgroup per sandbox where the machine lets the service make them: its memory as a whole (memory_mb
    plus disk_mb for each memory-backed mount) and its processes, which the per-process limits cannot
    bound together. It adds ~7 ms to each Run on this project's machines (cgroup v1; bench/RESULTS.md
    "Sandboxes"); false: per-process limits only."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.concurrency >= 1, self, "concurrency", "must be >= 1")
        for key in ("wall_s", "cpu_s", "max_wall_s", "session_idle_s"):
            require(getattr(self, key) > 0, self, key, "must be > 0")
        positive = (
            "memory_mb",
            "process_limit",
            "file_mb",
            "disk_mb",
            "output_bytes",
            "max_sessions",
            "session_mb",
            "first_uid",
        )
        for key in (*positive, "uids"):
            require(getattr(self, key) >= 1, self, key, "must be >= 1")
        require(self.wall_s <= self.max_wall_s, self, "wall_s", "must be <= max_wall_s")
        require(self.warm >= 0, self, "warm", "must be >= 0")
        require(self.uids >= self.concurrency + self.warm, self, "uids", "must be >= concurrency + warm")
