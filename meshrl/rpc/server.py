"""Start a meshrl gRPC server: health, reflection, size limits, interceptors, graceful stop.

    server = serve(MyServicer(), port=0)        # binds 127.0.0.1 unless told otherwise
    server.run_until_signal()                   # SIGTERM/SIGINT: NOT_SERVING, then drain

A servicer names its proto service in a SERVICE attribute, e.g.
`SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]`.
"""

import logging
import signal
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from meshrl import telemetry, tls
from meshrl.rpc.interceptors import (CapacityInterceptor, ErrorInterceptor, RoleInterceptor, TokenInterceptor,
                                    TracingInterceptor)
from meshrl.rpc.methods import service_handler
from meshrl.rpc.token import env_token

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 20  # batches stream in 4 MB parts; this bounds one odd message
LIGHT_RESERVE = 4  # threads beyond the work calls' kept for health, reflection and Describe
QUEUE_WAIT = 1.5  # seconds a call past the limit waits for a slot before RESOURCE_EXHAUSTED


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


class Server:
    def __init__(self, servicers: list, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_workers: int = 16, max_message_bytes: int = MAX_MESSAGE_BYTES, queue: int | None = None,
                 queue_wait: float = QUEUE_WAIT):
        """max_workers: work calls at once; queue (default: as many) more wait up to queue_wait seconds."""
        queue = max_workers if queue is None else queue
        interceptors = [TokenInterceptor(token)] if token else []
        credentials = tls.server_credentials(servicers[0].SERVICE.name) if servicers else None
        if credentials is not None:
            interceptors.append(RoleInterceptor())
        interceptors.append(CapacityInterceptor(max_workers, queue, queue_wait))
        if telemetry.enabled():
            interceptors.append(TracingInterceptor())  # outside the error mapping: the span sees the status
        interceptors.append(ErrorInterceptor())
        # gRPC shares a port with any server already on it by default (SO_REUSEPORT), which splits
        # connections between the two: a second server must fail to bind instead.
        options = [*channel_options(max_message_bytes), ("grpc.so_reuseport", 0)]
        # a thread per running and per waiting call, and the light calls' reserve
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers + queue + LIGHT_RESERVE),
                                   interceptors=interceptors, options=options)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        names = []
        for servicer in servicers:
            service = servicer.SERVICE
            self._server.add_generic_rpc_handlers((service_handler(servicer, service),))
            names.append(service.full_name)
        self.service_names = names
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self._server)
        try:
            self.port = (self._server.add_secure_port(f"{host}:{port}", credentials) if credentials else
                         self._server.add_insecure_port(f"{host}:{port}"))
        except RuntimeError:  # grpc raises, rather than returning 0, when the port is taken
            self.port = 0
        if self.port == 0:
            raise OSError(f"could not bind {host}:{port}" + (" (is another server on that port?)" if port else ""))
        self.address = f"{host}:{self.port}"
        self._stopped = threading.Event()

    def start(self) -> "Server":
        self._server.start()
        for name in ["", *self.service_names]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving %s on %s", ", ".join(self.service_names), self.address)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, refuse new calls, let running ones finish for `grace` seconds."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        log.info("stopped %s", self.address)

    def wait(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)

    def run_until_signal(self, grace: float = 5.0) -> None:
        """Block until SIGTERM or SIGINT, then stop gracefully (call from the main thread)."""
        def on_signal(signum, _frame):
            log.info("signal %s: stopping", signal.Signals(signum).name)
            threading.Thread(target=self.stop, args=(grace,), daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.wait()


def serve(*servicers, **kwargs) -> Server:
    """Build and start a Server for the given servicers (see Server for the options)."""
    return Server(list(servicers), **kwargs).start()


def run_service(servicer, args, label: str, max_workers: int = 16) -> int:
    """Serve one servicer with the --host/--port/--token flags until SIGTERM, then close it.

    Prints "<label> listening on HOST:PORT" once serving: launchers and tests read that line.
    """
    telemetry.setup(f"meshrl-{servicer.SERVICE.name.removesuffix('Service').lower()}")
    tls.set_role(tls.SERVER_ROLE.get(servicer.SERVICE.name, "orchestrator"))  # its own calls (the weight push)
    try:
        server = Server([servicer], host=args.host, port=args.port, token=args.token or env_token(),
                        max_workers=max_workers).start()
        print(f"{label} listening on {server.address}", flush=True)
        server.run_until_signal()
    finally:
        close = getattr(servicer, "close", None)
        if close is not None:
            close()
        telemetry.shutdown()
    return 0
