"""Which copy of a bucket a receiving process opens (meshrl.cuda_ipc.pick): the one on its own GPU,
found by UUID and renumbered as this process numbers its GPUs. Pure logic: no GPU needed."""

import pytest

from meshrl.cuda_ipc import pick


def copy(uuid: str, device: int, tag: bytes) -> list:
    return [uuid, [device, tag, 1024, 0, b"ref", 0, None, False]]


def test_each_process_takes_the_copy_on_its_own_gpu():
    # a 2-rank actor that sees GPUs A, B as 0, 1; a tensor-parallel rollout worker that sees only B (as 0)
    copies = [copy("GPU-A", 0, b"a"), copy("GPU-B", 1, b"b")]
    assert pick(copies, here={"GPU-B": 0}, mine="GPU-B") == [0, b"b", 1024, 0, b"ref", 0, None, False]
    assert pick(copies, here={"GPU-A": 0, "GPU-B": 1}, mine="GPU-A")[:2] == [0, b"a"]


def test_without_a_copy_on_its_gpu_it_reads_the_first_renumbered():
    copies = [copy("GPU-A", 3, b"a")]  # the sender calls A its device 3; here A is device 1
    assert pick(copies, here={"GPU-C": 0, "GPU-A": 1}, mine="GPU-C")[:2] == [1, b"a"]


def test_a_gpu_it_cannot_see_is_a_clear_error():
    with pytest.raises(ValueError, match="GPU-A is not visible to this process"):
        pick([copy("GPU-A", 0, b"a")], here={"GPU-B": 0}, mine="GPU-B")


def test_a_handle_without_uuid_keeps_its_device_index():
    assert pick([copy("", 2, b"a")], here={"GPU-B": 0}, mine="GPU-B")[:2] == [2, b"a"]
