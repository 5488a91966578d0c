"""`meshrl ray ALGORITHM [--config FILE] [section.key=value ...]`: place the services on a Ray cluster,
then run the algorithm against them.

Ray does placement and lifecycle only; the services are the same `meshrl serve ...` processes,
reached by gRPC. Per service (each replica of a rollout fleet too), one placement group with a
bundle per rank (ray.cpus_per_rank, ray.gpus_per_rank; STRICT_PACK, since a service's ranks run on
one node as children of its rank 0). Roles listed in ray.colocate (e.g. [rollout]) go into the
actor's placement group, on the actor's first bundle's node, sharing its GPU. In each group a
small Ray actor (ServiceHost) starts `meshrl serve ...` bound to its node's address, and reports
the address it listens on; the addresses go into the config (actor.address, ...; a fleet's as
rollout.address's list) and the trainer runs as usual. Replicas placed on other nodes than the actor
get the weights by stream (down a chain with rollout.weight_relay), whatever weight_transport says.

The services listen on their node's address, beyond loopback, so they speak mutual TLS (ray.tls,
default on): the run makes a CA and certificates (run_dir/certs, or MESHRL_TLS_DIR's), and each
ServiceHost writes only its service's role certificate and key, with the CA's, into a private folder
on its node; the run's token covers the rest.

    ray start --head --port 6379                      # machine 1
    ray start --address HEAD_IP:6379                  # machines 2..n
    meshrl ray grpo --config configs/arithmetic_grpo.yaml ray.address=auto ...
"""

import dataclasses
import logging
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from meshrl import tls
from meshrl.group import GROUP_SECRET_VAR, free_port, node_env
from meshrl.hosts import host_of
from meshrl.rpc.token import forget_run_token, run_token
from orchestrator import main as loops
from orchestrator.config import Config, ranks
from orchestrator.lifecycle import preflight
from orchestrator.lifecycle.fleet import is_replica, replica_names, role_of
from orchestrator.lifecycle.roles import MODELS, serve_args, served_role, service_roles
from orchestrator.lifecycle.services import DESCRIPTORS, launch
from orchestrator.run import trainer

if TYPE_CHECKING:  # ray itself is imported where it is used: run() sets its environment before
    from ray.util.placement_group import PlacementGroup

log = logging.getLogger(__name__)


class ServiceHost:
    """A Ray actor that runs one `meshrl serve ...` process on its node (or, for a trained service whose
    ranks span nodes, that service's ranks on this node) and stops them on request."""

    def __init__(self):
        self.proc, self.tls_dir = None, None
        self.ranks: dict[int, subprocess.Popen] = {}  # rank -> its process (ranks of a group across nodes)
        self.host = ""  # this node's address, once something started

    def node_address(self) -> str:
        """The address Ray knows this node by (the services bind it)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)

    def free_port(self) -> int:
        return free_port(self.node_address())

    def start(self, args: list[str], env: dict[str, str], certs: dict[str, bytes] | None = None) -> str:
        """Start the service; `certs` (file name -> bytes) go into a folder only this user can read."""
        host = self.host = self.node_address()
        if certs:
            self.tls_dir = tempfile.mkdtemp(prefix="meshrl-tls-")  # mode 0700
            for name, data in certs.items():
                fd = os.open(os.path.join(self.tls_dir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            env = {**env, tls.VAR: self.tls_dir}
        try:
            self.proc, address = launch([*args, "--host", host], env={**os.environ, **env})
        except RuntimeError as e:
            raise RuntimeError(f"{e} on {host}") from None
        return address

    def start_ranks(self, role: str, ranks: list[int], world_size: int, group: str, env: dict[str, str]) -> str:
        """Ranks `ranks` of a group across nodes whose rank 0 opens its store at `group` (env carries the
        run's MESHRL_GROUP_SECRET); they join it from here. Returns this node's address."""
        host = self.host = self.node_address()
        secret = env[GROUP_SECRET_VAR]
        for local, rank in enumerate(ranks):
            own = {**os.environ, **env, **node_env(rank, local, world_size, group, secret, host)}
            self.ranks[rank] = subprocess.Popen([sys.executable, "-m", "services.actor.rank", role], env=own)
        return host

    def ended(self) -> list[str]:
        """What this host started that has exited, in words (for the error of a failed step)."""
        named = ([("the service", self.proc)] if self.proc is not None else []) + [
            (f"rank {rank}", proc) for rank, proc in self.ranks.items()
        ]
        return [f"{what} on {self.host} {exit_words(p.returncode)}" for what, p in named if p.poll() is not None]

    def stop(self) -> int | None:
        procs = ([self.proc] if self.proc is not None else []) + list(self.ranks.values())
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.tls_dir:
            shutil.rmtree(self.tls_dir, ignore_errors=True)
        return None if self.proc is None else self.proc.returncode


@dataclasses.dataclass
class Placement:
    groups: dict[str, "PlacementGroup"]  # service (role, or replica of the rollout fleet) -> its placement group
    # role -> its ServiceHost's actor handle. Any: Ray types an actor's methods as the class's own (no
    # .remote) unless each is decorated with ray.method, which would import ray with this module
    hosts: dict[str, Any]
    extra: list[Any] = dataclasses.field(default_factory=list)  # hosts of ranks on other nodes


def place(cfg: Config, roles: set[str]) -> Placement:
    """Reserve a placement group per service (colocated roles join the actor's) and start the services."""
    import ray

    roles = service_roles(cfg, roles)
    rc = cfg.ray
    unknown = sorted(set(rc.colocate) - (roles - {"actor"}))
    if unknown:
        raise ValueError(
            f"ray.colocate names {unknown}, not services of this run besides the actor: {sorted(roles - {'actor'})}"
        )
    env = service_env()
    fleets = {"rollout": replica_names(cfg), "judge": cfg.judge.names()}  # each replica a service of its own
    names = [n for r in sorted(roles) for n in fleets.get(r, [r])]
    colocated = sum(role_of(n) in rc.colocate for n in names)
    placement = Placement({}, {})
    nodes: dict[str, list[list[int]]] = {}  # a trained service whose ranks span nodes: its bundles by node
    try:
        for name in sorted(names, key=lambda n: n != "actor"):  # the actor first: others may join its group
            if role_of(name) in rc.colocate:
                pg, share = placement.groups["actor"], colocated + 1
            else:
                pg, spread = reserve(cfg, name)
                placement.groups[name], share = pg, 1
                if spread:
                    nodes[name] = by_node(pg)
            # the host itself takes a slice of the first bundle (rank 0's); the service's ranks use the rest
            placement.hosts[name] = service_host(pg, 0, rc.gpus_per_rank / (share + 1) if rc.gpus_per_rank else 0)
        args = {n: serve_args(cfg, role_of(n)) for n in placement.hosts}
        own_env = {n: env for n in placement.hosts}
        for name, bundles in nodes.items():  # ranks on other nodes join rank 0's group there
            args[name], own_env[name] = start_far_ranks(cfg, placement, name, bundles, env, args[name])
        starts = [h.start.remote(args[n], own_env[n], role_certs(role_of(n))) for n, h in placement.hosts.items()]
        addresses = ray.get(starts)
    except BaseException:
        release(placement)
        raise
    record(cfg, roles, dict(zip(placement.hosts, addresses)))
    return placement


def service_env() -> dict[str, str]:
    """The environment the services need from this process (tracing, vLLM's CPU cache size, TLS's choice)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("MESHRL_", "OTEL_", "VLLM_"))}
    if not tls.enabled():  # ray.tls=false is the user's explicit choice of plain gRPC beyond loopback
        env["MESHRL_INSECURE_BIND"] = "1"
        log.warning(
            "ray.tls=false: the services listen on their nodes' addresses without TLS (the run's token "
            "travels in clear text)"
        )
    return env


def reserve(cfg: Config, name: str):
    """(the service's own placement group, ready; whether its ranks may spread over nodes)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    rc, role = cfg.ray, role_of(name)
    bundle = {"CPU": rc.cpus_per_rank, **({"GPU": rc.gpus_per_rank} if rc.gpus_per_rank else {})}
    spread = role in MODELS and ranks(cfg, role) > 1 and rc.rank_strategy != "STRICT_PACK"
    strategy = rc.rank_strategy if spread else "STRICT_PACK"
    pg = placement_group([dict(bundle) for _ in range(ranks(cfg, role))], strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=rc.placement_timeout)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise RuntimeError(
            f"the Ray cluster cannot place the {name} service: it needs {ranks(cfg, role)} bundle(s) of "
            f"{bundle} {'as ' + strategy if spread else 'on one node'}; available now: "
            f"{ray.available_resources()} (waited {rc.placement_timeout:.0f} s; lower "
            "ray.cpus_per_rank/gpus_per_rank or add nodes)"
        ) from None
    return pg, spread


def start_far_ranks(cfg: Config, placement: Placement, name: str, bundles: list[list[int]], env: dict, args: list):
    """Start the ranks of `name` on nodes other than rank 0's (a host each, placement.extra), to join rank
    0's group behind a fresh secret; (rank 0's service arguments, its environment)."""
    import ray

    secret, host0 = secrets.token_hex(16), placement.hosts[name]
    group = f"{ray.get(host0.node_address.remote())}:{ray.get(host0.free_port.remote())}"
    rank, role = len(bundles[0]), role_of(name)
    threads = {"OMP_NUM_THREADS": str(max(1, int(cfg.ray.cpus_per_rank)))}  # a rank's bundle
    for indices in bundles[1:]:
        placement.extra.append(service_host(placement.groups[name], indices[0], 0))
        ray.get(
            placement.extra[-1].start_ranks.remote(
                served_role(role),
                list(range(rank, rank + len(indices))),
                ranks(cfg, role),
                group,
                {**env, **threads, GROUP_SECRET_VAR: secret},
            )
        )
        rank += len(indices)
    log.info("%s: %d ranks on %d nodes, meeting at %s", name, ranks(cfg, role), len(bundles), group)
    more = ["--local-ranks", str(len(bundles[0])), "--group-port", group.rpartition(":")[2]]
    return [*args, *more], {**env, GROUP_SECRET_VAR: secret}


def record(cfg: Config, roles: set[str], placed: dict[str, str]) -> None:
    """The placed services' addresses into the run's config (the fleet as a list, in its order); a fleet
    with replicas off the actor's node takes the weights by stream."""
    for name, address in placed.items():
        if not is_replica(name) and role_of(name) != "judge":
            getattr(cfg, name).address = address
        log.info("placed %s at %s", name, address)
    if "judge" in roles:
        cfg.judge.address = ",".join(placed[n] for n in cfg.judge.names())
    if "rollout" not in roles:
        return
    cfg.rollout.address = ",".join(placed[n] for n in replica_names(cfg))
    far = [n for n in replica_names(cfg) if host_of(placed[n]) != host_of(placed.get("actor", placed[n]))]
    if far and cfg.rollout.weight_transport == "shm":
        log.warning(
            "rollout replicas %s are on other nodes than the actor, which shm cannot reach: the weights go "
            "by stream (rollout.weight_relay=%s) in this run",
            far,
            cfg.rollout.weight_relay,
        )
        cfg.rollout.weight_transport = "stream"


def service_host(pg, bundle: int, gpus: float):
    """A ServiceHost in bundle `bundle` of placement group `pg`."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return (
        ray.remote(ServiceHost)
        .options(
            num_cpus=0.01,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
        )
        .remote()
    )


def by_node(pg) -> list[list[int]]:
    """The group's bundle indices by node, bundle 0's node first (rank 0 and the ranks beside it)."""
    from ray.util import placement_group_table

    node_of = placement_group_table(pg)["bundles_to_node_id"]
    order: dict[str, list[int]] = {}
    for index in sorted(node_of, key=lambda i: (node_of[i] != node_of[0], i)):
        order.setdefault(node_of[index], []).append(index)
    return list(order.values())


def role_certs(role: str) -> dict[str, bytes] | None:
    """The CA's certificate and the role's own certificate and key (the actor's for ref and critic), from
    MESHRL_TLS_DIR; None without TLS."""
    if not tls.enabled():
        return None
    name = tls.SERVER_ROLE[DESCRIPTORS[role].name]  # the certificate its service presents
    folder = pathlib.Path(os.environ[tls.VAR])
    return {f: (folder / f).read_bytes() for f in ("ca.pem", f"{name}.pem", f"{name}.key")}


def certs_for_run(cfg: Config) -> bool:
    """With ray.tls and no MESHRL_TLS_DIR: make the run's certificates (run_dir/certs, naming every node's
    address) and point this process at them. Whether it did (the caller unsets it after the run)."""
    import ray

    if not cfg.ray.tls or tls.enabled():
        return False
    folder = pathlib.Path(cfg.trainer.run_dir).resolve() / "certs"
    tls.make_certs(folder, sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}))
    os.environ[tls.VAR] = str(folder)
    log.info("mutual TLS between the placed services: certificates in %s", folder)
    return True


def exit_words(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        cause = " (what an out-of-memory killer sends)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{cause}"
    return f"exited with code {code}"


def ended(placement: Placement) -> list[str]:
    """Every placed process that has exited, and every host Ray lost (with Ray's reason), in words."""
    import ray

    news = []
    for name, host in [*placement.hosts.items(), *(("ranks", h) for h in placement.extra)]:
        try:
            news += [f"{name}: {line}" for line in ray.get(host.ended.remote(), timeout=30)]
        except Exception as e:  # noqa: BLE001 - a dead host is news itself: Ray says why it died
            news.append(f"{name}'s host: {type(e).__name__}: {' '.join(str(e).split())[:600]}")
    return news


def release(placement: Placement) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    for host in [*placement.hosts.values(), *placement.extra]:
        try:
            ray.get(host.stop.remote(), timeout=90)
        except Exception as e:  # noqa: BLE001 - stopping the rest matters more
            log.warning("stopping a service host: %s", e)
    for pg in placement.groups.values():
        remove_placement_group(pg)


def run(algorithm: str, cfg: Config):
    preflight.check(cfg, loops.LOOPS[algorithm]().setup(cfg), local=False)  # before anything is placed
    if not cfg.ray.address:  # a local cluster on the loopback address, like embedded services; Ray reads
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # these when it is imported
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    started = not ray.is_initialized()
    if started:
        if cfg.ray.address:
            ray.init(address=cfg.ray.address)
        else:
            ray.init(
                num_cpus=cfg.ray.local_cpus, include_dashboard=False, object_store_memory=cfg.ray.object_store_bytes
            )
    try:
        algo = loops.LOOPS[algorithm]()
        trainer.trace_env(cfg, pathlib.Path(cfg.trainer.run_dir))  # the placed services trace like local ones
        token_made = run_token()  # every service is placed by this run: all require its token (in their env)
        certs_made = certs_for_run(cfg)
        try:
            placement = place(cfg, algo.setup(cfg))  # releases what it placed if it fails
            try:
                return trainer.run(cfg, algo)
            except trainer.StepFailed as e:
                news = ended(placement)  # a rank killed on its node says nothing to rank 0 but "reset by peer"
                if news:
                    raise trainer.StepFailed(f"{e}; on the Ray cluster: {'; '.join(news)}") from None
                raise
            finally:
                release(placement)
        finally:
            if token_made:
                forget_run_token()
            if certs_made:
                os.environ.pop(tls.VAR, None)
    finally:
        if started:
            ray.shutdown()


def main(argv: list[str]) -> int:
    return loops.main(argv, runner=run, prog="meshrl ray")
