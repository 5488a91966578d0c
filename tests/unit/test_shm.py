"""Shared-memory segments (meshrl.shm): created, reopened, grown, and never left behind by a failure."""

import pytest
import torch

from meshrl.shm import SHM_DIR, Segment


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
