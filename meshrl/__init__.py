"""meshrl's shared package: what services and the orchestrator both use.

The batch type (DataProto), its wire codec, the gRPC scaffolding, the generated
protobuf code (meshrl.v1), tiny local models and data. Services and the
orchestrator import from here; nothing here imports them.

`from meshrl import DataProto` works; the import is lazy so that light processes
(reward workers, CLI help) do not pay for importing torch.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["DataProto"]
_EXPORTS = {"DataProto": "meshrl.dataproto"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'meshrl' has no attribute {name!r}")
