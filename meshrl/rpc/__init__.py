"""gRPC scaffolding every meshrl service and client shares.

- methods: handlers and client callables for a proto service, with the batch codec.
- interceptors: errors -> status codes, bearer-token check, the work limit and its queue.
- server: serve() with health, reflection, size limits, graceful SIGTERM.
- client: Client with deadlines, retries on UNAVAILABLE and on busy refusals (retry-after), health wait.
"""

from meshrl.rpc.client import Client
from meshrl.rpc.server import Server, serve

__all__ = ["Client", "Server", "serve"]
