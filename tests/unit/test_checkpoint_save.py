"""A checkpoint is whole or absent (orchestrator.run.checkpoints.save): written under step_N.partial/ and
renamed when complete; a full disk, in the orchestrator or in a service, is one line naming the disk,
and leaves neither a partial folder nor a new "latest"."""

import errno
import json
import shutil

import grpc
import pytest

from meshrl import disk
from meshrl.errors import ServiceError
from orchestrator.run.checkpoints import DiskFull, save


class Algo:
    trained = ("actor",)

    def state_dict(self):
        return {"kl": 0.1}


class Mesh:
    """Writes each role's part as a service would, or fails as a full disk makes it."""

    def __init__(self, fail: BaseException | None = None):
        self.fail = fail

    def save(self, role, path, export_hf=False):
        path.mkdir(parents=True)
        (path / "model.bin").write_bytes(b"weights")
        if self.fail is not None:
            raise self.fail


def test_a_saved_step_is_renamed_into_place_whole(tmp_path):
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)  # a step redone after a recovery
    (tmp_path / "checkpoints" / "step_2" / "stale").write_text("old")
    path = save(tmp_path, 2, Mesh(), Algo(), sampler_state={"epoch": 0}, last=False)
    assert path == tmp_path / "checkpoints" / "step_2"
    assert sorted(p.name for p in path.iterdir()) == ["actor", "orchestrator.json"]
    assert json.loads((path / "orchestrator.json").read_text())["step"] == 2
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_2"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.endswith(".partial")] == []


@pytest.mark.parametrize(
    "fail",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        ServiceError("127.0.0.1:1", "SaveCheckpoint", grpc.StatusCode.INTERNAL, "[Errno 28] No space left on device"),
        ServiceError(  # an actor before issue 58 (item 13): DCP's short write, "no space" nowhere
            "127.0.0.1:1",
            "SaveCheckpoint",
            grpc.StatusCode.INTERNAL,
            "RuntimeError: rank 0: RuntimeError: DCP could not save the checkpoint at /c/actor: RuntimeError: "
            "[enforce fail at inline_container.cc:778] . unexpected pos 704 vs 598",
        ),
        ServiceError(  # an actor now, of its own disk as it sees it (it may be another machine's)
            "127.0.0.1:1",
            "SaveCheckpoint",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "rank 0: DiskFull: cannot save the checkpoint: the disk holding /c/actor is full (3 bytes free)",
        ),
    ],
)
def test_a_full_disk_says_so_and_leaves_the_last_good_checkpoint(tmp_path, fail, monkeypatch):
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12, 0))
    save(tmp_path, 5, Mesh(), Algo(), sampler_state={"epoch": 0}, last=False)
    said = "/c/actor is full (3" if "/c/actor is full" in str(fail) else f"{tmp_path / 'checkpoints'} is full (0"
    wanted = f"cannot save step 10: the disk holding {said} bytes free); the last whole checkpoint: step_5"
    with pytest.raises(DiskFull) as e:
        save(tmp_path, 10, Mesh(fail), Algo(), sampler_state={"epoch": 1}, last=False)
    assert e.value.strerror == wanted  # the one line the run ends with (trainer.save_if_due)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_5"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_5"


def test_another_failure_is_raised_as_it_was_and_leaves_nothing(tmp_path):
    lost = ServiceError("127.0.0.1:1", "SaveCheckpoint", grpc.StatusCode.UNAVAILABLE, "Connection refused")
    with pytest.raises(ServiceError, match="Connection refused"):
        save(tmp_path, 3, Mesh(lost), Algo(), sampler_state={}, last=False)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == []
