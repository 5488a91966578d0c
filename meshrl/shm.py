"""Shared-memory segments for weights: a file in /dev/shm, mapped, reused across updates.

Reusing one segment is ~10x faster than a fresh one per update (fresh pages must
be faulted in; shared NOTES), so a writer keeps its segment and only grows it.
Tensors are views into the mapping; no pickle, no copy on the reading side.
"""

import mmap
import os
import pathlib
import uuid

import torch

SHM_DIR = pathlib.Path("/dev/shm")


class Segment:
    def __init__(self, name: str, size: int | None = None):
        """Open segment `name`; with `size`, create it (or grow it) to at least that many bytes."""
        if "/" in name or not name:
            raise ValueError(f"bad shared-memory segment name {name!r}")
        self.name, self.path = name, SHM_DIR / name
        created = False
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            if size is None:
                raise ValueError(f"no shared-memory segment {name!r}") from None
            fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), True
        try:
            if size is not None and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            # MAP_POPULATE maps every page now, in one call, instead of one fault per 4 KiB page later
            self.map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)) \
                if self.size else None
        except BaseException:
            if created:  # a segment that could not be sized or mapped is not left in /dev/shm
                self.path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    @classmethod
    def create(cls, size: int, prefix: str = "meshrl") -> "Segment":
        """A new segment named after its creator's process id: what a killed process left is found by it
        (remove_segments_of)."""
        return cls(f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}", size)

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


def remove_segments_of(pid: int) -> list[str]:
    """Unlink the segments a dead process created (Segment.create names them after it): a process killed
    with SIGKILL cannot remove its own. Only for a pid known to be dead and not reused."""
    gone = []
    for path in SHM_DIR.glob(f"meshrl*-{pid}-*"):
        path.unlink(missing_ok=True)
        gone.append(path.name)
    return gone
