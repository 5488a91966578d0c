"""The committed generated code matches the protos, and the protos keep the batch convention."""

import filecmp

import pytest

from meshrl import protogen
from meshrl.v1 import actor_pb2, common_pb2, data_pb2, env_pb2, reward_pb2, rollout_pb2, sandbox_pb2

MODULES = [actor_pb2, common_pb2, data_pb2, env_pb2, reward_pb2, rollout_pb2, sandbox_pb2]


def test_generated_code_is_fresh(tmp_path):
    pytest.importorskip("grpc_tools")
    protogen.generate(tmp_path)
    fresh = sorted(p.name for p in (tmp_path / "meshrl" / "v1").iterdir())
    committed = protogen.ROOT / "meshrl" / "v1"
    assert fresh, "protoc wrote nothing"
    stale = [
        n
        for n in fresh
        if not (committed / n).exists() or not filecmp.cmp(tmp_path / "meshrl" / "v1" / n, committed / n, shallow=False)
    ]
    assert not stale, f"stale generated code {stale}: run `python -m meshrl.protogen`"
    extra = {p.name for p in committed.glob("*_pb2*")} - set(fresh)
    assert not extra, f"generated files without a proto: {sorted(extra)}"


def test_every_proto_has_a_module():
    assert {p.stem for p in protogen.proto_files()} == {m.__name__.split(".")[-1].removesuffix("_pb2") for m in MODULES}


def all_messages():
    for module in MODULES:
        yield from module.DESCRIPTOR.message_types_by_name.values()


def test_batches_travel_only_in_a_top_level_field_named_data():
    """The fast codec writes a DataProto only in a field `DataProto data`; anywhere else it would be slow.
    A `bytes data` field is the other fast path (meshrl.codec.rawbytes, e.g. weight buckets)."""
    dp = data_pb2.DataProto.DESCRIPTOR
    for msg in all_messages():
        for f in msg.fields:
            if f.message_type is dp:
                assert f.name == "data" and not f.is_repeated, f"{msg.full_name}.{f.name}"
            elif f.name == "data" and msg.file is not data_pb2.DESCRIPTOR and f.type != f.TYPE_BYTES:
                raise AssertionError(f"{msg.full_name}.data must be a DataProto (or raw bytes)")


def test_services_are_versioned():
    for module in (actor_pb2, reward_pb2, rollout_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.full_name.startswith("meshrl.v1.")
