"""meshrl's shared package: what services and the orchestrator both use.

The batch type (DataProto), its wire codec, the gRPC scaffolding, the generated
protobuf code (meshrl.v1), tiny local models and data. Services and the
orchestrator import from here; nothing here imports them.
"""

from meshrl.dataproto import DataProto

__all__ = ["DataProto"]
__version__ = "0.1.0"
