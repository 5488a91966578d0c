"""LoadCheckpoint loads only what a SaveCheckpoint of ours wrote (issue 27, item 10): a pickle planted under
the checkpoint root is never unpickled, an altered or added file is refused, an untouched checkpoint loads."""

import hashlib
import json
import os
import pathlib
import pickle
import shutil
import time

import grpc
import pytest
import torch
from actor_process import Service, batch

from meshrl.errors import ServiceError
from meshrl.v1 import actor_pb2
from services.actor import integrity


class Planted:
    """Unpickling it makes the folder `marker`: evidence that code from the checkpoint ran."""

    def __init__(self, marker: pathlib.Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.makedirs, (self.marker,)


def plant(folder: pathlib.Path, marker: pathlib.Path) -> None:
    """A DCP checkpoint's metadata replaced by a pickle that runs code."""
    (folder / "dcp").mkdir(parents=True, exist_ok=True)
    (folder / "dcp" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))


def refused(s: Service, folder: pathlib.Path, why: str, marker: pathlib.Path) -> None:
    """LoadCheckpoint of folder is FAILED_PRECONDITION naming `why`, at once, and ran nothing from it."""
    start = time.monotonic()
    with pytest.raises(ServiceError) as e:
        load(s, folder.name)
    assert not marker.exists(), folder.name
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, (folder.name, e.value)
    assert why in e.value.details, (folder.name, e.value.details)
    assert time.monotonic() - start < 10, folder.name  # refused before any rank reads the checkpoint


def load(s: Service, path: str, timeout: float = 120):
    return s.client.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=path), timeout=timeout)


@pytest.fixture(scope="module")
def actor(tiny_lm, tmp_path_factory):
    """Two ranks (a rank that died of a bad checkpoint left rank 0's call unanswered), signing with a key file
    of their own (XDG_CONFIG_HOME), which this test reads too."""
    root = tmp_path_factory.mktemp("root")
    with pytest.MonkeyPatch.context() as env:
        env.delenv(integrity.KEY_VAR, raising=False)
        env.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
        s = Service("--role", "actor", "--model", str(tiny_lm), "--world-size", "2", "--lr", "1e-3", root=str(root))
        s.root = root
        yield s
        s.stop()


def test_only_checkpoints_we_saved_load(actor, tmp_path):
    root = actor.root
    actor.update(1, "sft", batch(seed=4))
    probe = batch(seed=3)
    saved = actor.logprobs(probe)
    actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path="good"))
    good = root / "good"
    marker = tmp_path / "ran"

    bare = root / "planted"  # a folder that looks like an actor checkpoint, made by someone else
    plant(bare, marker)
    (bare / "actor_service.json").write_text(json.dumps({"last_step": 1, "weight_version": 1, "role": "actor"}))
    swapped = root / "swapped"  # one of ours whose metadata was replaced by the pickle
    shutil.copytree(good, swapped)
    plant(swapped, marker)
    refused(actor, bare, "no integrity record", marker)
    refused(actor, swapped, "dcp/.metadata", marker)

    altered = root / "altered"  # one of ours with a byte of its weights changed
    shutil.copytree(good, altered)
    shard = sorted((altered / "dcp").glob("*.distcp"))[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    name = str(shard.relative_to(altered))
    refused(actor, altered, name, marker)
    forged = root / "forged"  # the same, its record's digest updated by someone without the key
    shutil.copytree(altered, forged)
    record = json.loads((forged / "integrity.json").read_text())
    record["files"][name] = hashlib.sha256(raw).hexdigest()
    (forged / "integrity.json").write_text(json.dumps(record))
    refused(actor, forged, "integrity record is not", marker)
    extra = root / "extra"  # one of ours with a file added
    shutil.copytree(good, extra)
    (extra / "dcp" / "__9_0.distcp").write_bytes(b"\0" * 64)
    refused(actor, extra, "dcp/__9_0.distcp", marker)

    signed = root / "signed"  # malformed but signed with our key (by this user): loaded, fails at once
    shutil.copytree(good, signed)
    (signed / "dcp" / ".metadata").write_bytes(pickle.dumps(None))
    integrity.sign(signed, {}, integrity.checkpoint_key())
    start = time.monotonic()
    with pytest.raises(ServiceError, match="DCP could not load"):
        load(actor, "signed")
    assert time.monotonic() - start < 10

    actor.update(2, "sft", batch(seed=5))  # the service is still whole, and an untouched checkpoint loads
    assert load(actor, "good").step == 1
    assert torch.equal(actor.logprobs(probe), saved)
