"""Sealed weight segments (meshrl.shm.seal / open_sealed): the writer's checks, one at a time."""

import os

import pytest
import torch

from meshrl.shm import SEAL_BYTES, SHM_DIR, WEIGHT_PREFIX, Segment, open_sealed, seal


@pytest.fixture
def segment():
    seg = Segment.create(4096 + SEAL_BYTES, prefix=WEIGHT_PREFIX)
    yield seg
    seg.unlink()


def test_only_the_latest_seal_opens_and_the_seal_stays_out_of_reach(segment):
    old = seal(segment)
    new = seal(segment)  # the next update's Begin
    with pytest.raises(ValueError, match="not sealed for this update"):
        open_sealed(segment.name, old)
    writer = open_sealed(segment.name, new)
    assert writer.size == 4096
    writer.tensor(torch.uint8, [4096], 0).fill_(7)  # all the bucket's bytes, none of the seal's
    with pytest.raises(ValueError, match="does not fit"):
        writer.tensor(torch.uint8, [1], 4096)
    assert open_sealed(segment.name, new).size == 4096  # still sealed


def test_a_new_file_under_the_same_name_is_mapped_anew(segment):
    open_sealed(segment.name, seal(segment))
    segment.unlink()
    again = Segment(segment.name, 8192 + SEAL_BYTES)
    try:
        assert open_sealed(segment.name, seal(again)).size == 8192
    finally:
        again.unlink()


def test_a_fifo_of_our_naming_is_refused_without_blocking():
    path = SHM_DIR / f"{WEIGHT_PREFIX}-{os.getpid()}-{'f' * 12}"
    os.mkfifo(path, 0o600)
    try:
        with pytest.raises(ValueError, match="not a regular file"):
            open_sealed(path.name, bytes(32))
    finally:
        path.unlink()


def test_names_and_nonces_that_cannot_be_ours():
    for name in ("", "../etc/passwd", "meshrl-rollout-1-abc", f"{WEIGHT_PREFIX}-1-{'a' * 12}/x", "psm_1234"):
        with pytest.raises(ValueError, match="not named like"):
            open_sealed(name, bytes(32))
    with pytest.raises(ValueError, match="no seal"):
        open_sealed(f"{WEIGHT_PREFIX}-1-{'a' * 12}", b"")
