"""Shared-memory segments (meshrl.shm): created, reopened, grown, and never left behind by a failure."""

import subprocess
import sys

import pytest
import torch

from meshrl.shm import SHM_DIR, Segment, sweep


def files(prefix: str) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{prefix}-*"))


def test_create_open_grow_unlink():
    seg = Segment.create(64, prefix="meshrl-test-a")
    seg.tensor(torch.float32, [4], 0)[:] = torch.arange(4.0)
    again = Segment(seg.name)
    assert torch.equal(again.tensor(torch.float32, [4], 0), torch.arange(4.0))
    grown = Segment(seg.name, 4096)
    assert grown.size == 4096 and torch.equal(grown.tensor(torch.float32, [4], 0), torch.arange(4.0))
    for s in (again, grown):
        s.close()
    seg.unlink()
    assert files("meshrl-test-a") == []
    with pytest.raises(ValueError, match="no shared-memory segment"):
        Segment(seg.name)


def test_a_segment_that_cannot_be_sized_is_not_left_behind():
    """A BeginWeightUpdate asking for more than /dev/shm can give left its file there (34 after a fuzz run)."""
    with pytest.raises(OSError):
        Segment.create(2**62, prefix="meshrl-test-b")
    assert files("meshrl-test-b") == []


def creator(prefix: str) -> tuple[subprocess.Popen, str]:
    """Another process that creates a segment and keeps it (as a rollout keeps its weight segment)."""
    code = f"from meshrl.shm import Segment; print(Segment.create(4096, prefix={prefix!r}).name, flush=True); input()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_a_killed_creators_segment_goes_at_the_next_create_and_a_live_ones_stays():
    """A run SIGKILLed whole (the OOM killer) left its weight segment in /dev/shm for good (issue 58,
    item 12): the next Segment.create, in any process, removes it; a live creator's stays."""
    (dead, left), (live, kept) = creator("meshrl-test-c"), creator("meshrl-test-c")
    try:
        dead.kill()
        dead.wait()
        assert (SHM_DIR / left).exists()  # nothing ran at its death
        # a live creator whose pid is free here (in another container sharing /dev/shm): its lock keeps it
        foreign = Segment(f"meshrl-test-c-{dead.pid}-{'0' * 12}", 4096)
        mine = Segment.create(64, prefix="meshrl-test-c")
        assert files("meshrl-test-c") == sorted([kept, mine.name, foreign.name])
        mine.unlink()
        foreign.unlink()
    finally:
        live.kill()
        live.wait()
    assert kept in sweep() and files("meshrl-test-c") == []
