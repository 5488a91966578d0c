"""A full disk at a checkpoint is said in one line, naming the folder and the bytes free (issue 58, item 13):
meshrl.disk's message from each form the failure takes (ENOSPC, its relayed text, DCP's short write, a
disk with room that is not full), and the actor's rank and servicer raising it as RESOURCE_EXHAUSTED
instead of INTERNAL with a traceback. No real disk is filled: shutil.disk_usage is patched."""

import errno
import shutil
import types

import grpc
import pytest

from meshrl import disk
from meshrl.errors import status_for
from services.actor.comm import RankError
from services.actor.handler import RankHandler
from services.actor.servicer import ActorServicer

# what the actor said before: the DCP save's error, as services/actor/engine/base.py words it
DCP_SHORT_WRITE = (
    "DCP could not save the checkpoint at {path}: RuntimeError: [enforce fail at inline_container.cc:778] . "
    "PytorchStreamWriter failed writing file data/0: file write failed ... unexpected pos 704 vs 598"
)


@pytest.fixture
def free(monkeypatch):
    """Set the bytes shutil.disk_usage reports free (0 unless a test says otherwise)."""
    room = {"free": 0}

    def usage(path):
        return shutil._ntuple_diskusage(10**12, 10**12 - room["free"], room["free"])

    monkeypatch.setattr(disk.shutil, "disk_usage", usage)
    return room


def test_enospc_and_its_relayed_text_say_the_disk_is_full(tmp_path, free):
    wanted = f"the disk holding {tmp_path} is full (0 bytes free)"
    assert disk.full_disk(tmp_path, OSError(errno.ENOSPC, "No space left on device")) == wanted
    assert disk.full_disk(tmp_path, RuntimeError("rank 1: OSError: [Errno 28] No space left on device")) == wanted
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as e:
        assert disk.full_disk(tmp_path, e) == wanted  # found in the cause
    free["free"] = 5 << 30  # an explicit ENOSPC is believed, whatever is free once the writer let go
    assert (
        disk.full_disk(tmp_path, OSError(errno.ENOSPC, "x"))
        == f"the disk holding {tmp_path} is full (5368709120 bytes free)"
    )


def test_dcps_short_write_is_the_disks_only_when_the_disk_is_full(tmp_path, free):
    short = RuntimeError(DCP_SHORT_WRITE.format(path=tmp_path / "actor"))
    folder = tmp_path / "actor"  # not made yet: the nearest existing parent's disk is asked
    assert disk.full_disk(folder, short) == f"the disk holding {folder} is full (0 bytes free)"
    free["free"] = 5 << 30
    assert disk.full_disk(folder, short) is None  # a short write with room left is some other failure
    assert disk.full_disk(folder, RuntimeError("CUDA error: an illegal memory access")) is None


def test_said_full_is_one_line_and_passes_anything_else(tmp_path, free):
    with pytest.raises(disk.DiskFull) as e:
        with disk.said_full(tmp_path, "the checkpoint"):
            raise RuntimeError(DCP_SHORT_WRITE.format(path=tmp_path))
    assert str(e.value) == f"cannot save the checkpoint: the disk holding {tmp_path} is full (0 bytes free)"
    assert status_for(e.value) == grpc.StatusCode.RESOURCE_EXHAUSTED  # not INTERNAL: no traceback logged
    with pytest.raises(KeyError):
        with disk.said_full(tmp_path, "the checkpoint"):
            raise KeyError("model")


def test_a_rank_whose_save_hits_a_full_disk_raises_disk_full(tmp_path, free):
    class Engine:
        lora = False

        def save(self, path):
            raise RuntimeError(DCP_SHORT_WRITE.format(path=path))

    handler = RankHandler("actor")
    handler.role = types.SimpleNamespace(engine=Engine())  # type: ignore[assignment]
    with pytest.raises(disk.DiskFull, match=rf"the disk holding {tmp_path} is full \(0 bytes free\)"):
        handler.save({"path": str(tmp_path)})


def test_the_servicer_answers_a_ranks_full_disk_with_resource_exhausted(tmp_path, free):
    said = f"DiskFull: cannot save the checkpoint: the disk holding {tmp_path / 'ckpt'} is full (0 bytes free)"
    failures = {"DiskFull": said, "RuntimeError": "RuntimeError: " + DCP_SHORT_WRITE.format(path=tmp_path / "ckpt")}
    for error_type, message in failures.items():  # said by the rank, or only its DCP text reached rank 0

        def call(method, args, parts, alive, error_type=error_type, message=message):
            raise RankError(1, error_type, message)

        driver = types.SimpleNamespace(group=types.SimpleNamespace(world_size=2), call=call)
        servicer = ActorServicer("actor", driver, tmp_path)  # type: ignore[arg-type]
        servicer.init_args = {"model": "m", "engine": {}, "optim": {}}
        request = types.SimpleNamespace(path="ckpt", export_hf=False)
        with pytest.raises(disk.DiskFull) as e:
            servicer.SaveCheckpoint(request, None)  # type: ignore[arg-type]
        assert "\n" not in str(e.value) and f"the disk holding {tmp_path / 'ckpt'} is full (0 bytes free)" in str(
            e.value
        )
