"""The services a run uses: started here as local processes on 127.0.0.1, or already running elsewhere.

Given an address in the config, the service there is used (after a health
check that names it if it is missing); otherwise `meshrl serve ...` starts it
and it is stopped when the run ends.
"""

import concurrent.futures
import logging
import subprocess
import sys
import threading
import time

from meshrl import forkserver
from meshrl.lifeline import child_env, forward
from meshrl.rpc import Client
from meshrl.rpc.client import NotGrpc
from meshrl.shm import remove_segments_of
from meshrl.v1 import actor_pb2, env_pb2, reward_pb2, rollout_pb2
from orchestrator.lifecycle.fleet import role_of

log = logging.getLogger(__name__)

DESCRIPTORS = {
    "actor": actor_pb2.DESCRIPTOR.services_by_name["ActorService"],
    "ref": actor_pb2.DESCRIPTOR.services_by_name["ActorService"],
    "teacher": actor_pb2.DESCRIPTOR.services_by_name["ActorService"],
    "critic": actor_pb2.DESCRIPTOR.services_by_name["ActorService"],
    "rollout": rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
    "reward": reward_pb2.DESCRIPTOR.services_by_name["RewardService"],
    "env": env_pb2.DESCRIPTOR.services_by_name["EnvService"],
    "judge": rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],  # a frozen model the rollout serves
}


# What a role's address answering in HTTP/1 most likely is, and what to set instead
HTTP1_HINTS = {
    "reward": (
        ": for an OpenRLHF-style reward server use reward.url=http://{address}/... "
        "(OpenRLHF's serve_rm answers on /get_reward)"
    ),
}


# vLLM logs every engine step's figures at INFO to stdout: under a run's progress bar that is noise, and
# on stdout, which is read here only up to the "listening on" line, it would fill the pipe. A user who
# sets either variable keeps theirs.
QUIET = {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}


Process = subprocess.Popen | forkserver.Forked


def spawn(serve_args: list[str], env: dict[str, str] | None = None, forked: bool = True) -> Process:
    """`meshrl serve ...` as a child that dies with this process (meshrl.lifeline). It runs in a session of
    its own: Ctrl-C in the terminal interrupts the orchestrator alone, which then stops its services in
    order, rather than every service dying under a call in flight and the run blaming the first it called.
    Forked from this run's fork server where it runs (meshrl.forkserver) and `forked`, started afresh
    otherwise."""
    server = forkserver.running() if forked else None
    if server is not None and env is None:
        try:
            return server.spawn(["serve", *serve_args], {**QUIET, **child_env(env)})
        except OSError as e:
            log.warning("starting `meshrl serve %s` afresh: %s", " ".join(serve_args), e)
    return fresh(serve_args, env)


def fresh(serve_args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """`meshrl serve ...` in an interpreter of its own (what spawn does without a fork server)."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", *serve_args],
        stdout=subprocess.PIPE,
        text=True,
        env={**QUIET, **child_env(env)},
        start_new_session=True,
    )


def launch(serve_args: list[str], env: dict[str, str] | None = None) -> tuple[Process, str]:
    """Start `meshrl serve <serve_args>`; returns the process and the address it says it listens on."""
    return listening(spawn(serve_args, env), serve_args)


def listening(proc: Process, serve_args: list[str]) -> tuple[Process, str]:
    """Wait for a started service's "listening on ADDRESS" line; the process that printed it (another, started
    afresh, where the fork server went away before it forked this one)."""
    out = proc.stdout
    assert out is not None  # spawn() pipes it
    line = out.readline()
    while line and "listening on" not in line:
        line = out.readline()
    if not line and isinstance(proc, forkserver.Forked) and proc.wait() is not None and proc.unforked:
        log.warning("the fork server exited before it started `meshrl serve %s`: starting it afresh", serve_args[0])
        return listening(fresh(serve_args), serve_args)
    if not line:
        raise RuntimeError(f"`meshrl serve {' '.join(serve_args)}` did not start (exit code {proc.wait()})")
    # what it prints from now on goes to this process's stderr: a pipe nobody reads blocks its writer
    threading.Thread(target=forward, args=(out,), daemon=True).start()
    return proc, line.split()[-1]


class Services:
    def __init__(self, forked: bool = True):
        self.forked = forked  # started from the fork server where one runs (trainer.fork_server)
        self.procs: list[Process] = []
        self.clients: dict[str, Client] = {}
        self.spawned: dict[str, Process] = {}  # started, not yet waited for
        self.ours: dict[str, tuple[Process, list[str]]] = {}  # started here and ready: (process, args)
        self.starting: dict[str, concurrent.futures.Future] = {}  # respawned, until they listen
        self.waiter: concurrent.futures.ThreadPoolExecutor | None = None  # waits for their listening lines
        self.server_lost = False  # the fork server died (said once)
        self.given_token: str | None = None  # the token for services given by address ("": none; None: the
        #   environment's, as for ours)

    def start(self, name: str, address: str, serve_args: list[str], timeout: float = 600) -> Client:
        """Use the service at `address`, or start `meshrl serve <serve_args>` and use that."""
        return self.start_all({name: (address, serve_args)}, timeout)[name]

    def spawn_all(self, wanted: dict[str, tuple[str, list[str]]]) -> None:
        """Start the processes of the services that have no address, without waiting for them: their
        imports and model loads then overlap whatever the caller does before start_all."""
        for name, (address, args) in wanted.items():
            if not address and name not in self.spawned:
                self.spawned[name] = spawn(args, forked=self.forked)
                self.procs.append(self.spawned[name])

    def start_all(self, wanted: dict[str, tuple[str, list[str]]], timeout: float = 600) -> dict[str, Client]:
        """{name: (address, serve_args)}: the services to start are all started at once (their model loads
        and vLLM's engine start overlap), then each is waited for and checked in turn."""
        self.spawn_all(wanted)
        return {
            name: self._ready(name, address, self.spawned.pop(name, None), args, timeout)
            for name, (address, args) in wanted.items()
        }

    def _ready(self, name: str, address: str, proc, serve_args: list[str], timeout: float) -> Client:
        if proc is not None:
            try:
                proc, address = self._listening(proc, serve_args)
            except RuntimeError as e:
                raise RuntimeError(f"the {name} service did not start: {e}") from None
            log.info("started %s service at %s", name, address)
            self.ours[name] = (proc, serve_args)
        return self._client(name, address, ours=proc is not None, timeout=timeout)

    def _client(self, name: str, address: str, ours: bool, timeout: float = 600) -> Client:
        # One retry for a child on loopback: UNAVAILABLE there means it died, and restarting it (run.recovery)
        # beats 1.4 s of backoff; a service given by address keeps the client's three, for a flaky network.
        client = Client(
            address,
            DESCRIPTORS[role_of(name)],
            timeout=timeout,
            retries=1 if ours else 3,
            token=None if ours else self.given_token,
        )
        try:
            client.wait_ready(60)
        except TimeoutError as e:
            raise RuntimeError(f"the {name} service is not reachable: {e}") from None
        except NotGrpc:  # a web server there: for the reward, what a user of OpenRLHF's remote RM means
            hint = HTTP1_HINTS.get(role_of(name), "").format(address=address)
            raise ValueError(f"{name}.address={address} answers HTTP/1, not gRPC{hint}") from None
        except ValueError as e:  # something else answers there
            raise ValueError(f"{name}.address={address}: {e}") from None
        self.clients[name] = client
        return client

    def _listening(self, proc: Process, serve_args: list[str]) -> tuple[Process, str]:
        """listening(), keeping `procs` to the process that listens."""
        listener, address = listening(proc, serve_args)
        if listener is not proc:
            self.procs[self.procs.index(proc)] = listener
        return listener, address

    def dead(self) -> set[str]:
        """The services started here whose process has exited. Where the fork server died, the services it
        had forked died with it (meshrl.lifeline): their ends are waited for, and what starts them again
        starts them afresh (spawn)."""
        if forkserver.died() and not self.server_lost:
            self.server_lost = True
            log.warning("the fork server died, and the services it had started with it: they start afresh")
        return {name for name, (proc, _) in self.ours.items() if proc.poll() is not None}

    def _bury(self, name: str, proc: Process) -> None:
        """Stop one of ours for good: its client closed, its process killed, its shm segments removed."""
        self.starting.pop(name, None)
        client = self.clients.pop(name, None)
        if client is not None:
            client.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self.procs.remove(proc)
        for segment in remove_segments_of(proc.pid):  # a killed rollout cannot remove its own
            log.info("removed %s, left by the dead %s service", segment, name)

    def restart(self, names: set[str], timeout: float = 600) -> dict[str, Client]:
        """Start these (of ours) again with the same arguments, at once; their new clients."""
        for name in names:
            self._bury(name, self.ours[name][0])
        return self.start_all({name: ("", self.ours.pop(name)[1]) for name in names}, timeout)

    def respawn(self, name: str) -> None:
        """Start one of ours again without waiting for it (a rollout replica comes back while the run goes
        on without it); started(name) gives its client once it listens."""
        proc, args = self.ours[name]
        self._bury(name, proc)
        self.spawn_one(name, args)

    def spawn_one(self, name: str, args: list[str]) -> None:
        """Start `meshrl serve <args>` as `name` without waiting for it; started(name) gives its client."""
        new = spawn(args, forked=self.forked)
        self.procs.append(new)
        self.ours[name] = (new, args)
        if self.waiter is None:
            self.waiter = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="meshrl-respawn")
        self.starting[name] = self.waiter.submit(self._listening, new, args)

    def stop_one(self, name: str) -> None:
        """Stop one of ours (SIGTERM, then SIGKILL after 60 s) and forget it; a given one's client is closed."""
        if name in self.ours:
            proc, _ = self.ours.pop(name)
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pass  # _bury kills it
            self._bury(name, proc)
        else:
            client = self.clients.pop(name, None)
            if client is not None:
                client.close()

    def started(self, name: str) -> Client | None:
        """The client of a service respawn() started, once it listens (None before); RuntimeError when it
        exited instead."""
        waiting = self.starting[name]
        if not waiting.done():
            return None
        del self.starting[name]
        try:
            proc, address = waiting.result()
        except RuntimeError as e:
            raise RuntimeError(f"the {name} service did not start again: {e}") from None
        self.ours[name] = (proc, self.ours[name][1])
        log.info("started %s service again at %s", name, address)
        return self._client(name, address, ours=True)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to every process started here, their clients closed, and each waited for within one
        shared `grace` (seconds), killed past it. Nothing here waits without a bound: a channel whose call
        was interrupted by Ctrl-C can deadlock in close() (grpc/grpc#19973), so the clients are closed on a
        thread of their own, which the stop does not wait on for long."""
        for p in self.procs:
            p.terminate()
        clients, self.clients = list(self.clients.values()), {}
        closing = threading.Thread(target=close_all, args=(clients,), name="meshrl-close", daemon=True)
        closing.start()
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s of SIGTERM: killed", p.args, grace)
                p.kill()
        for p in self.procs:
            try:
                p.wait(5)  # SIGKILL cannot be ignored; a process in uninterruptible sleep is left to the kernel
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        closing.join(2)
        if self.waiter is not None:  # its threads end with the processes they read
            self.waiter.shutdown(wait=False)

    def kill_all(self) -> None:
        """SIGKILL to every process started here, waiting for nothing (the stop of last resort)."""
        for p in list(self.procs):
            p.kill()


def close_all(clients: list[Client]) -> None:
    for c in clients:
        c.close()
