"""Shared-memory segments for weights: a file in /dev/shm, mapped, reused across updates.

Reusing one segment is ~10x faster than a fresh one per update (fresh pages must
be faulted in; shared NOTES), so a writer keeps its segment and only grows it.
Tensors are views into the mapping; no pickle, no copy on the reading side.

Who may write where (the weight push): the rollout creates and owns its staging
segment, and the actor writes into the segment the rollout's BeginWeightUpdate
reply names. A name from the wire is not trusted: an actor once wrote 11.8 MB
into whatever /dev/shm file a rollout named. So the owner `seal`s its segment at
each update: the segment's last SEAL_BYTES hold a magic and a fresh random nonce,
and the reply carries the nonce (WeightUpdateStatus.shm_nonce). The writer
(`open_sealed`) writes only into a segment that
- is named like ours (WEIGHT_SEGMENT: meshrl-rollout-PID-12 hex digits),
- is a regular file directly in /dev/shm, owned by this user, with one link, not
  reached through a symlink (O_NOFOLLOW; checked with fstat on the open file, and
  that same file is what gets mapped, so nothing can be swapped in between),
- holds the nonce of this update: proof that it was made (or re-stamped) for this
  push. A caller of another user cannot read a segment's nonce (mode 0600), so it
  cannot point us at a live segment of another run; one of the same user could
  write anywhere anyway.
The other design, the actor creating the segment and naming it to the rollout,
would move the same question to the rollout's side (a rollout reading whatever
file an actor names into its weights) and need a second staging segment for the
stream transport; sealing keeps one segment, owned by the side that keeps it
across updates. The seal sits at the end, not the start, so every reader's offsets
(refs count from byte 0) stay as they are.

A process killed with SIGKILL (a whole run, by the OOM killer) cannot remove its
segments, and a weight segment is the model's size. So every segment Segment.create
makes carries its creator's pid in its name and a lock its creator holds until it
unlinks it or exits, and each create first removes the segments whose creator is
gone by both marks (sweep).
"""

import errno
import fcntl
import hmac
import mmap
import os
import pathlib
import re
import secrets
import stat
import uuid

import torch

from meshrl import lifeline

SHM_DIR = pathlib.Path("/dev/shm")
WEIGHT_PREFIX = "meshrl-rollout"  # the weight-staging segments a rollout creates (Segment.create names them)
WEIGHT_SEGMENT = re.compile(rf"{WEIGHT_PREFIX}-[0-9]+-[0-9a-f]{{12}}")
CREATED = re.compile(r"meshrl(?:-[a-z]+)*-([0-9]+)-[0-9a-f]{12}")  # Segment.create's names: PREFIX-PID-HEX
SEAL_BYTES = 64  # at the end of a weight segment: SEAL_MAGIC, the nonce, zeros
SEAL_MAGIC = b"meshrl-seal-v1\0\0"
NONCE_BYTES = 32


class Segment:
    def __init__(self, name: str, size: int | None = None):
        """Open segment `name`; with `size`, create it (or grow it) to at least that many bytes."""
        if "/" in name or not name:
            raise ValueError(f"bad shared-memory segment name {name!r}")
        self.name, self.path = name, SHM_DIR / name
        self.lock_fd: int | None = None  # the creator's: held until it unlinks the segment or exits (sweep)
        created = False
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            if size is None:
                raise ValueError(f"no shared-memory segment {name!r}") from None
            fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), True
            fcntl.flock(fd, fcntl.LOCK_SH)  # before it is sized: sweep leaves an empty file alone
        try:
            if size is not None and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            self.map = _map(fd, self.size)
        except BaseException:
            if created:  # a segment that could not be sized or mapped is not left in /dev/shm
                self.path.unlink(missing_ok=True)
            os.close(fd)
            raise
        if created:
            self.lock_fd = fd  # not inherited by an exec'd child (PEP 446); a forked one shares it
        else:
            os.close(fd)

    @classmethod
    def create(cls, size: int, prefix: str = "meshrl") -> "Segment":
        """A new segment named after its creator's process id, after removing what dead creators left
        (sweep): a run killed whole (the OOM killer) left its weight segment, the model's size, for good."""
        sweep()
        return cls(f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}", size)

    @classmethod
    def _of_fd(cls, name: str, fd: int, size: int) -> "Segment":
        """The segment open as `fd` (already checked by the caller), mapped whole."""
        seg = cls.__new__(cls)
        seg.name, seg.path, seg.size, seg.map = name, SHM_DIR / name, size, _map(fd, size)
        seg.lock_fd = None  # not its creator
        return seg

    def tensor(self, dtype: torch.dtype, shape: list[int], offset: int) -> torch.Tensor:
        """A view of the bytes at offset as a tensor (no copy)."""
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"tensor of {nbytes} bytes at offset {offset} does not fit a segment of {self.size}")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.map, dtype=dtype, count=numel, offset=offset).view(shape)

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view is still alive; the mapping goes when it does
                pass
            self.map = None

    def unlink(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def _map(fd: int, size: int) -> mmap.mmap | None:
    # MAP_POPULATE maps every page now, in one call, instead of one fault per 4 KiB page later
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)) if size else None


_open: dict[str, Segment] = {}


def attach(name: str) -> Segment:
    """The segment `name`, mapped once per process and kept: weight updates come again and again,
    and mapping anew costs page-table work every time."""
    seg = _open.get(name)
    if seg is None or seg.map is None or seg.size != os.stat(SHM_DIR / name).st_size:
        if seg is not None:
            seg.close()
        seg = _open[name] = Segment(name)
    return seg


def seal(seg: Segment) -> bytes:
    """Stamp a fresh nonce into the weight segment's last SEAL_BYTES (its owner, at each update's Begin);
    returns the nonce, for the reply that names the segment."""
    if seg.size <= SEAL_BYTES:
        raise ValueError(f"segment {seg.name!r} of {seg.size} bytes has no room for its seal")
    nonce = secrets.token_bytes(NONCE_BYTES)
    assert seg.map is not None, f"segment {seg.name!r} is closed"
    seg.map[seg.size - SEAL_BYTES : seg.size] = (SEAL_MAGIC + nonce).ljust(SEAL_BYTES, b"\0")
    return nonce


_sealed: dict[str, tuple[tuple[int, int, int], Segment]] = {}  # name -> ((device, inode, size), mapping)


def open_sealed(name: str, nonce: bytes) -> Segment:
    """The weight segment `name` for writing, only if it is ours and sealed with `nonce` (see the module's
    docstring); ValueError otherwise, before a byte is written. Its `size` leaves out the seal. The mapping
    is kept across updates while the file stays the same (device, inode, size)."""
    if not WEIGHT_SEGMENT.fullmatch(name):
        raise ValueError(
            f"shared-memory segment {name[:100]!r} is not named like a meshrl weight segment ({WEIGHT_PREFIX}-PID-HEX)"
        )
    if len(nonce) != NONCE_BYTES:
        raise ValueError(
            f"no seal for shared-memory segment {name!r} (shm_nonce of {len(nonce)} bytes, not "
            f"{NONCE_BYTES}): an older rollout? Use the stream transport"
        )
    fd = _open_own(name)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1 or st.st_size <= SEAL_BYTES:
            raise ValueError(
                f"shared-memory segment {name!r} is not a regular file of this user's with one link and room for a seal"
            )
        key = (st.st_dev, st.st_ino, st.st_size)
        known = _sealed.get(name)
        if known is None or known[0] != key or known[1].map is None:
            if known is not None:
                known[1].close()
            _sealed[name] = (key, Segment._of_fd(name, fd, st.st_size))
        seg = _sealed[name][1]
    finally:
        os.close(fd)
    assert seg.map is not None  # mapped above: st_size > SEAL_BYTES
    if not hmac.compare_digest(
        bytes(seg.map[st.st_size - SEAL_BYTES : st.st_size - SEAL_BYTES + len(SEAL_MAGIC) + NONCE_BYTES]),
        SEAL_MAGIC + nonce,
    ):
        raise ValueError(f"shared-memory segment {name!r} is not sealed for this update (its nonce differs)")
    seg.size = st.st_size - SEAL_BYTES  # tensors may not reach into the seal
    return seg


def _open_own(name: str) -> int:
    """Open /dev/shm/name for writing without following a symlink or blocking on a FIFO."""
    try:
        return os.open(SHM_DIR / name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise ValueError(f"no shared-memory segment {name!r}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"shared-memory segment {name!r} is a symlink") from None
        raise ValueError(f"cannot open shared-memory segment {name!r}: {e.strerror}") from None


def remove_segments_of(pid: int) -> list[str]:
    """Unlink the segments a dead process created (Segment.create names them after it): a process killed
    with SIGKILL cannot remove its own. Only for a pid known to be dead and not reused."""
    gone = []
    for path in SHM_DIR.glob(f"meshrl*-{pid}-*"):
        path.unlink(missing_ok=True)
        gone.append(path.name)
    return gone


def sweep() -> list[str]:
    """Unlink the segments of creators that are gone (named CREATED, this user's), so that what a killed run
    left is removed by the next one; the names removed.

    A segment goes only if both say its creator is gone: the pid in its name is no running process here
    (a zombie counts as gone), and nobody holds the lock its creator takes at creation and keeps until it
    unlinks the segment or exits. The pid alone is not enough: containers that share /dev/shm (the compose
    files' `ipc: service:shm`) each number their processes from 1, so a live rollout's pid may be free
    here; the lock is the same file's wherever its holder runs. A pid reused since keeps a leftover until
    that process ends too (a segment kept too long, never one removed too soon)."""
    gone = []
    for path in SHM_DIR.iterdir():
        match = CREATED.fullmatch(path.name)
        if match is not None and not lifeline.running(int(match.group(1))) and _unlink_unheld(path):
            gone.append(path.name)
    return gone


def _unlink_unheld(path: pathlib.Path) -> bool:
    """Unlink `path` if it is this user's regular file and nobody holds its lock; False if kept."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # gone already, a symlink, not ours to read
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its creator (or a fork of it) lives, maybe in another pid namespace
            return False
        # empty: a creator between its open and its lock (it sizes the file only after locking it)
        if os.fstat(fd).st_size == 0 or os.stat(path, follow_symlinks=False).st_ino != st.st_ino:
            return False
        path.unlink(missing_ok=True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
