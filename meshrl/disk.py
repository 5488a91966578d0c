"""A write that failed for want of space, said in one line: which folder's disk, and how much is free.

A full disk reaches a checkpoint save in several forms: OSError ENOSPC (or EDQUOT, a quota) from our own
writes; the text of such an error relayed by an actor rank or a service; and, from inside torch's DCP,
the serializer's own short-write message ("unexpected pos 704 vs 598": it wrote fewer bytes than it
asked and the errno is lost), which said nothing of space and came with a traceback. The last is put
down to the disk only when the disk is in fact (nearly) full after the failure: shutil.disk_usage.
"""

import contextlib
import errno
import os
import pathlib
import shutil

from meshrl.errors import ResourceExhausted

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
SAID = "the disk holding"  # how full_disk's line begins: found again in a relayed error's text
FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), SAID)  # relayed as text (a rank, a service)
SHORT_WRITE_TEXTS = ("unexpected pos",)  # torch's PyTorchStreamWriter after a short write (DCP's shards)
NEARLY_FULL = 64 << 20  # bytes free under which a short write is the disk's doing


class DiskFull(ResourceExhausted):
    """A save failed for want of space (RESOURCE_EXHAUSTED); the message names the folder and the bytes free."""


def full_disk(folder: str | pathlib.Path, error: BaseException) -> str | None:
    """'the disk holding FOLDER is full (N bytes free)' when `error` (or what caused it) shows a write that
    failed for want of space on that disk; None for any other failure."""
    errors = _chain(error)
    said = any(isinstance(e, OSError) and e.errno in FULL_ERRNOS for e in errors)
    said = said or any(t in str(e) for e in errors for t in FULL_TEXTS)
    if not (said or any(t in str(e) for e in errors for t in SHORT_WRITE_TEXTS)):
        return None
    free = free_bytes(folder)
    if not said and (free is None or free >= NEARLY_FULL):  # a short write with room left: not the disk's
        return None
    return f"{SAID} {folder} is full ({'?' if free is None else free} bytes free)"


def free_bytes(folder: str | pathlib.Path) -> int | None:
    """Bytes free to this user on the disk holding `folder` (or its nearest existing parent); None if unknown."""
    path = pathlib.Path(folder).absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


@contextlib.contextmanager
def said_full(folder: str | pathlib.Path, what: str):
    """Run the body; a failure that full_disk puts down to the disk becomes DiskFull, in one line
    ("cannot save WHAT: the disk holding FOLDER is full (N bytes free)"), anything else passes as it was."""
    try:
        yield
    except DiskFull:  # said already, nearer the disk (an actor rank)
        raise
    except Exception as e:
        full = full_disk(folder, e)
        if full is None:
            raise
        raise DiskFull(f"cannot save {what}: {full}") from e


def _chain(error: BaseException) -> list[BaseException]:
    """`error`, what caused it (__cause__, __context__) and, for DCP's CheckpointException, each rank's."""
    seen: list[BaseException] = []
    todo = [error]
    while todo and len(seen) < 32:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        failures = getattr(e, "failures", None)  # CheckpointException: {rank: (exception, its stack)}
        if isinstance(failures, dict):
            for failure in failures.values():
                first = failure[0] if isinstance(failure, tuple) else failure
                if isinstance(first, BaseException):
                    todo.append(first)
    return seen
