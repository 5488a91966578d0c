"""What the run does with its rollout fleet between steps: bring back the replicas set aside during the last
one (heal), and make the fleet what RUN_DIR/fleet.json asks for (resize; lifecycle.fleet).

    tend(state)   # before every step
"""

import logging

import grpc

from meshrl import hosts
from meshrl.errors import ServiceError
from orchestrator.lifecycle.fleet import given_addresses, read_fleet, replica_index, replica_names
from orchestrator.lifecycle.roles import serve_args
from orchestrator.run.recovery import answers
from orchestrator.run.state import RunState

log = logging.getLogger(__name__)


def tend(state: RunState) -> None:
    resize(state)
    heal(state)


def resize(state: RunState) -> None:
    """Start, reach or remove replicas when RUN_DIR/fleet.json changed: {"replicas": N} for a fleet the run
    starts, {"address": "A,B,..."} for one given by address (its first replica stays). A new replica is
    set aside until heal() has given it the weights."""
    wanted = read_fleet(state.run_dir)
    if wanted is None or wanted == state.fleet:
        return
    state.fleet = wanted
    cfg, mesh = state.cfg, state.mesh
    given = bool(given_addresses(cfg))
    if ("address" in wanted) != given:
        log.warning(
            "fleet.json asks for %s, but this run's fleet is %s: ignored (use `meshrl fleet RUN_DIR %s`)",
            "replicas given by address" if "address" in wanted else "replicas it starts",
            "given by address" if given else "started by the run",
            "--address A,B,..." if given else "--replicas N",
        )
        return
    current = list(mesh.replicas)
    if given:
        listed = hosts.address_list(str(wanted["address"]))
        at = {mesh[n].address: n for n in current}
        gone = [n for a, n in at.items() if a not in listed and n != "rollout"]
        for address in (a for a in listed if a not in at):
            name = next_name(current)
            try:
                state.services._client(name, address, ours=False)
            except (RuntimeError, ValueError) as e:
                log.warning("fleet.json: %s not added: %s", address, e)
                continue
            mesh.clients[name] = state.services.clients[name]
            mesh.router.add(name)
            current.append(name)
            log.info("fleet.json: rollout replica %s at %s joins once it has the weights", name, address)
    else:
        count = int(wanted.get("replicas", 0))
        if count < 1:
            log.warning("fleet.json: replicas=%s must be >= 1: ignored", wanted.get("replicas"))
            return
        target = replica_names(cfg, count)
        gone = [n for n in current if n not in target]
        cores = hosts.share_cores(count) if count > 1 and not hosts.gpus() else None
        for i, name in enumerate(target):
            if name in current:
                continue
            args = serve_args(cfg, "rollout") + (["--cpus", cores[i]] if cores else [])
            state.services.spawn_one(name, args)
            mesh.router.add(name)
            log.info("fleet.json: starting rollout replica %s; it joins once it has the weights", name)
    for name in gone:
        drained = mesh.router.remove(name)
        state.services.stop_one(name)
        mesh.clients.pop(name, None)
        log.info("fleet.json: rollout replica %s removed%s", name, "" if drained else " (its calls cut off)")


def next_name(names: list[str]) -> str:
    return f"rollout-{max(replica_index(n) for n in names) + 1}"


def heal(state: RunState) -> None:
    """Between steps: bring back the rollout replicas set aside during a step (a Generate or a push they
    failed; the step went on without them). One of ours is started again without waiting for it (a
    restart, counted in trainer/restarts up to trainer.max_restarts) and taken back at the first step
    boundary after it listens; one given by address once it answers again (its own supervisor restarts
    it). Each gets the fleet's weights before it gets work."""
    mesh, services = state.mesh, state.services
    for name in sorted(mesh.router.down):
        if name in services.starting:
            try:
                client = services.started(name)
            except RuntimeError as e:  # it died while it started: set aside still, tried again next step
                log.warning("%s", e)
                services.starting.pop(name, None)
                continue
            if client is None:
                continue  # still starting
            mesh.clients[name] = client
        elif name in services.ours:
            if state.restarts >= state.cfg.trainer.max_restarts:
                log.warning("rollout replica %s stays set aside: trainer.max_restarts is spent", name)
                continue
            state.restarts += 1
            log.warning(
                "restarting rollout replica %s (restart %d of %d); the run goes on without it meanwhile",
                name,
                state.restarts,
                state.cfg.trainer.max_restarts,
            )
            services.respawn(name)
            continue
        elif not answers(mesh[name]):
            continue  # asked again before the next step
        if mesh.weight_version:
            try:
                mesh.push_weights(mesh.weight_version, replicas=[name])
            except ServiceError as e:  # FAILED_PRECONDITION: it kept these weights (a given one that came back)
                if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("rollout replica %s stays set aside: the weight push to it failed: %s", name, e)
                    continue
        mesh.router.mark_up(name)
        log.info("rollout replica %s (%s) is back at weight version %d", name, mesh[name].address, mesh.weight_version)
