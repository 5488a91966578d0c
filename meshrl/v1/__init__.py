"""Generated protobuf and gRPC code for protos/meshrl/v1: never edit by hand.

Regenerate with `python -m meshrl.protogen`; tests/unit/test_protos.py fails when
these files are stale.
"""
