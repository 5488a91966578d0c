"""Start a meshrl gRPC server: health, reflection, size limits, interceptors, graceful stop.

    server = serve(MyServicer(), port=0)        # binds 127.0.0.1 unless told otherwise
    server.run_until_signal()                   # SIGTERM/SIGINT: NOT_SERVING, then drain

A servicer names its proto service in a SERVICE attribute, e.g.
`SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]`.

Beyond loopback a server speaks TLS (MESHRL_TLS_DIR) unless told otherwise (insecure_bind, the
--insecure-bind flag or MESHRL_INSECURE_BIND=1): a plain port there lets any machine that reaches it
call it, and a token would cross the network in clear text.
"""

import ipaddress
import logging
import os
import signal
import sys
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from meshrl import telemetry, tls
from meshrl.config.rollout import MAX_CALLS
from meshrl.rpc.interceptors import (
    CapacityInterceptor,
    ErrorInterceptor,
    RoleInterceptor,
    TokenInterceptor,
    TracingInterceptor,
)
from meshrl.rpc.methods import service_handler
from meshrl.rpc.token import env_token

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 20  # batches stream in 4 MB parts; this bounds one odd message
LIGHT_RESERVE = 4  # threads beyond the work calls' kept for health, reflection and Describe
QUEUE_WAIT = 5.0  # seconds a call past the limit waits for a slot before RESOURCE_EXHAUSTED
# calls that may wait, per work slot: 100 callers of a 16-slot service all wait rather than most being
# refused (with a queue of 16 and 1.5 s, 75% of 100 callers' calls were refused and goodput halved;
# with 8 x 16 and 5 s none were, at the 16-caller rate: bench/RESULTS.md, issue 42)
QUEUE_PER_SLOT = 8
MAX_WORKERS = MAX_CALLS  # work calls a server serves at once


INSECURE_BIND_VAR = "MESHRL_INSECURE_BIND"  # =1: serve beyond loopback without TLS (as --insecure-bind)


def is_loopback(host: str) -> bool:
    """127.x.x.x, ::1 or localhost; anything else (0.0.0.0, ::, an address, another name) reaches further."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


class BindRefused(ValueError):
    """check_bind's refusal: the user's flags or environment, which `meshrl serve` says in one line (exit 2)
    whichever service's main met it (cli/main.py cmd_serve)."""


def check_bind(host: str, tls_on: bool, insecure_bind: bool = False) -> None:
    """BindRefused (a ValueError) for a bind beyond loopback without TLS that nobody asked for."""
    if tls_on or is_loopback(host) or insecure_bind or os.environ.get(INSECURE_BIND_VAR) == "1":
        return
    raise BindRefused(
        f"refusing to serve on {host or 'every address'} without TLS: any machine that reaches the "
        "port could call it, and a token would travel in clear text. Set MESHRL_TLS_DIR (`meshrl "
        f"certs`), bind 127.0.0.1, or accept it with --insecure-bind (or {INSECURE_BIND_VAR}=1)"
    )


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes), ("grpc.max_receive_message_length", max_message_bytes)]


class Server:
    def __init__(  # noqa: PLR0913 - keyword settings of a server, each with a default
        self,
        servicers: list,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        max_workers: int = MAX_WORKERS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        queue: int | None = None,
        queue_wait: float = QUEUE_WAIT,
        insecure_bind: bool = False,
    ):
        """max_workers: work calls at once; queue (default: QUEUE_PER_SLOT times as many) more wait up to
        queue_wait seconds;
        insecure_bind: serve beyond loopback without TLS (else ValueError, see check_bind)."""
        queue = QUEUE_PER_SLOT * max_workers if queue is None else queue
        interceptors: list[grpc.ServerInterceptor] = [TokenInterceptor(token)] if token else []
        credentials = tls.server_credentials(servicers[0].SERVICE.name) if servicers else None
        check_bind(host, credentials is not None, insecure_bind)
        # who may call when nothing checks the caller, for the warning at start
        self._open_to = None if credentials or token else "any local user" if is_loopback(host) else "anyone"
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
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers + queue + LIGHT_RESERVE),
            interceptors=interceptors,
            options=options,
        )
        self._register(servicers)
        self.port = self._bind(host, port, credentials)
        self.address = f"{host}:{self.port}"
        self._stopped = threading.Event()
        self._started = False

    def _register(self, servicers: list) -> None:
        """The servicers' methods, health checking and reflection on the server."""
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        names = []
        self._servicers = servicers
        for servicer in servicers:
            service = servicer.SERVICE
            self._server.add_generic_rpc_handlers((service_handler(servicer, service),))
            names.append(service.full_name)
        self.service_names = names
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], self._server
        )

    def _bind(self, host: str, port: int, credentials) -> int:
        """The port bound (OSError when it cannot be)."""
        try:
            bound = (
                self._server.add_secure_port(f"{host}:{port}", credentials)
                if credentials
                else self._server.add_insecure_port(f"{host}:{port}")
            )
        except RuntimeError:  # grpc raises, rather than returning 0, when the port is taken
            bound = 0
        if bound == 0:
            raise OSError(f"could not bind {host}:{port}" + (" (is another server on that port?)" if port else ""))
        return bound

    def start(self) -> "Server":
        if self._stopped.is_set():  # told to stop (a signal) before it started: it never serves
            return self
        self._server.start()
        self._started = True
        self.set_serving(True)
        for servicer in self._servicers:
            watch = getattr(servicer, "watch_health", None)
            if watch is not None:  # a servicer that can lose the means to work says so (env workers)
                watch(self.set_serving)
        log.info("serving %s on %s", ", ".join(self.service_names), self.address)
        if self._open_to:
            log.warning(
                "%s on %s has no token and no TLS: %s can call it; set MESHRL_TOKEN (or "
                "MESHRL_TOKEN_FILE) or MESHRL_TLS_DIR to close it",
                ", ".join(self.service_names),
                self.address,
                self._open_to,
            )
        return self

    def set_serving(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING for the whole server (ignored once it is stopping)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            self.health.set(name, status)

    def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, refuse new calls, let running ones finish for `grace` seconds."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        log.info("stopped %s", self.address)

    def wait(self, timeout: float | None = None) -> bool:
        if not self._started:
            return True
        return self._server.wait_for_termination(timeout)

    def stop_on_signals(self, grace: float = 5.0) -> "Server":
        """SIGTERM or SIGINT stops it gracefully from now on (call from the main thread, before start():
        a signal that came once it answered, before its handler was in, killed it uncleaned, exit -15)."""

        def on_signal(signum, _frame):
            log.info("signal %s: stopping", signal.Signals(signum).name)
            threading.Thread(target=self.stop, args=(grace,), daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        return self

    def run_until_signal(self, grace: float = 5.0) -> None:
        """Block until SIGTERM or SIGINT, then stop gracefully (call from the main thread)."""
        self.stop_on_signals(grace)
        self.wait()


def serve(*servicers, **kwargs) -> Server:
    """Build and start a Server for the given servicers (see Server for the options)."""
    return Server(list(servicers), **kwargs).start()


def run_service(servicer, args, label: str, max_workers: int = 16) -> int:
    """Serve one servicer with the --host/--port/--token/--insecure-bind flags until SIGTERM, then close it.

    Prints "<label> listening on HOST:PORT" once serving: launchers and tests read that line; a bind
    that check_bind refuses is one line on stderr and exit code 2.
    """
    telemetry.setup(f"meshrl-{servicer.SERVICE.name.removesuffix('Service').lower()}")
    tls.set_role(tls.SERVER_ROLE.get(servicer.SERVICE.name, "orchestrator"))  # its own calls (the weight push)
    try:
        try:
            server = Server(
                [servicer],
                host=args.host,
                port=args.port,
                token=args.token or env_token(),
                max_workers=max_workers,
                insecure_bind=getattr(args, "insecure_bind", False),
            )
        except ValueError as e:  # the user's flags or environment: one line, not a traceback
            print(f"{label}: {e}", file=sys.stderr)
            return 2
        server.stop_on_signals().start()  # handlers first: whoever sees it answer may stop it at once
        print(f"{label} listening on {server.address}", flush=True)
        server.wait()
    finally:
        close = getattr(servicer, "close", None)
        if close is not None:
            close()
        telemetry.shutdown()
    return 0
