"""meshrl's shared package: what services and the orchestrator both use.

The batch type (DataProto), its wire codec, the gRPC scaffolding, the generated
protobuf code (meshrl.v1), tiny local models and data. Services and the
orchestrator import from here; nothing here imports them.

`from meshrl import DataProto` works; the import is lazy so that light processes
(reward workers, CLI help) do not pay for importing torch.
"""

import importlib
import os

# Intel MKL (torch's CPU BLAS) may change how many threads a call uses at run time unless told not to, and
# with it the order of a matmul's sums: Intel names MKL_DYNAMIC=FALSE a condition of run-to-run identical
# results. meshrl promises those (a resumed run ends bit-identical to an uninterrupted one), so every
# process that imports meshrl, and the services it starts, asks for them; a user's own setting stands.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

__version__ = "0.1.0"
__all__ = ["DataProto"]
_EXPORTS = {"DataProto": "meshrl.dataproto"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'meshrl' has no attribute {name!r}")
