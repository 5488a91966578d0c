"""What a run does after a failed step: find what was lost, bring it back, say where to go on from.

    number, batch = recover(error, state)   # state: the run's (run.state.RunState)

A service is lost when it died (one of ours), stopped answering (one given by
address: its own supervisor, e.g. docker compose's restart policy, brings it
back and the run waits for it), or holds weights between two steps (an Update
stopped halfway, e.g. when its deadline passed). A lost rollout or reward
service costs only its step: it is retried on the same prompts, after a new
rollout is given the actor's weights. A lost trained service (actor, critic)
sends the whole mesh back to the last checkpoint, or to the start when there is
none, since a trained service's state lives only there; the rollout and trained
services of ours start afresh then (a rollout takes no weights older than its
own), a reward or ref service only if it died (neither holds state of the run).
"""

import logging

import grpc
import torch

from meshrl.errors import ServiceError
from orchestrator.lifecycle.fleet import is_replica
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.loops.algorithm import Algorithm
from orchestrator.run.checkpoints import resume
from orchestrator.run.state import RunState

log = logging.getLogger(__name__)
GIVEN_WAIT = 300.0  # seconds a run waits for a service given by address to answer again


class StepFailed(RuntimeError):
    """A step could not finish; says which and where the run can resume from."""


def snapshot(sampler, algorithm: Algorithm, partial=None) -> dict:
    return {
        "sampler": sampler.state_dict(),
        "algorithm": algorithm.state_dict(),
        "rng": torch.get_rng_state(),
        "partial": partial.state_dict() if partial is not None else None,
    }


def recover(error: StepFailed, state: RunState) -> tuple[int, tuple | None]:
    """Bring back what the failed step (state.number, its batch state.batch) lost; (step, batch) to go on
    from (batch None: the sampler's next). Re-raises the error when nothing was lost (the failure is the
    request's, not a service's), when trainer.max_restarts is spent (state.restarts counts this failure),
    or when a lost state cannot be restored."""
    cfg, services, mesh, algorithm = state.cfg, state.services, state.mesh, state.algorithm
    number, restarts = state.number, state.restarts
    if restarts > cfg.trainer.max_restarts:
        raise error
    dead = services.dead()
    down = {name for name, c in mesh.clients.items() if name not in services.ours and not answers(c)}
    partial = {name for name in algorithm.trained if name not in dead | down and between_steps(mesh, name)}
    torn = {name for name in mesh.replicas if name not in dead and torn_weights(mesh, name)}  # a dead one says nothing
    lost = (dead | down | partial) & set(algorithm.trained)
    if not dead | down | partial | torn:
        raise error
    found = [(dead, "died"), (down, "not answering"), (partial, "stopped between two steps")]
    found.append((torn, "holding half a weight update"))
    what = "; ".join(f"{', '.join(sorted(names))} {why}" for names, why in found if names)
    log.warning("%s; %s: restart %d of %d", error, what, restarts, cfg.trainer.max_restarts)
    stateful = set(services.ours) & {*algorithm.trained, *mesh.replicas} if lost else set()
    if dead | stateful:
        mesh.clients.update(services.restart(dead | stateful))
    for name in sorted(down):
        log.warning("waiting up to %.0f s for %s at %s", GIVEN_WAIT, name, mesh.clients[name].address)
        try:
            mesh.clients[name].wait_ready(GIVEN_WAIT)
        except TimeoutError:
            raise error from None
    back = [name for name in mesh.replicas if name in dead | down | torn | stateful]
    for name in back:  # it gets work again (after the push below, or resume's)
        mesh.router.mark_up(name)
    if not lost:
        if back and number > 1:  # a new replica has the base model (a torn one, part of a push that broke
            #   off): give it the actor's
            push_again(mesh, number - 1, error, back)
        return number, state.batch
    step = go_back(error, state)
    assert state.log is not None  # open while train() runs the steps
    state.log.forget_after(step)
    return step + 1, None


def go_back(error: StepFailed, state: RunState) -> int:
    """The whole mesh back to the last checkpoint, or to the start when there is none (if every service is
    where it started); the step it holds."""
    mesh, algorithm = state.mesh, state.algorithm
    try:
        step = resume(state.run_dir, mesh, algorithm, state.sampler, partial=state.partial)
    except ServiceError as e:  # e.g. a given rollout refuses weights older than its own
        raise StepFailed(f"{error}; going back to the last checkpoint failed: {e}") from None
    if step == 0:
        moved = [
            name
            for name in (*algorithm.trained, *mesh.replicas)
            if name in mesh.clients and name not in state.services.ours and mesh[name].describe().weight_version != 0
        ]
        if moved:
            raise StepFailed(
                f"{error}; {', '.join(moved)} (given by address) hold trained weights and there is no "
                "checkpoint to go back to: set trainer.save_every to make one"
            ) from None
        state.sampler.load_state_dict(state.start["sampler"])
        algorithm.load_state_dict(state.start["algorithm"])
        torch.set_rng_state(state.start["rng"])
        if state.partial is not None:
            state.partial.load_state_dict(state.start["partial"])
    return step


def check_not_ahead(mesh: Mesh, trained: tuple[str, ...], step: int) -> None:
    """At a run's start (step: the last one done, 0 for a fresh run): a trained service that has applied a
    later step, or a rollout holding a later weight version, would refuse this run's updates and pushes
    one by one; say so once, with the fix. Such a service was trained or pushed by another run (or by a
    caller without the run's token: services the run starts require it)."""
    ahead = []
    for role in (*trained, *mesh.replicas):
        if role not in mesh.clients:
            continue
        info = mesh[role].describe()
        done = info.weight_version if is_replica(role) else int(info.details.get("last_step", "0") or 0)
        if done > step:
            what = "weight version" if is_replica(role) else "step"
            ahead.append(f"{role} at {mesh[role].address} holds {what} {done}")
    if ahead:
        raise ValueError(
            f"{'; '.join(ahead)}, ahead of this run (at step {step}): it was trained or pushed by "
            "another run. Restart it, or resume the run that trained it (trainer.run_dir of that run, "
            "trainer.resume=true)"
        )


def push_again(mesh: Mesh, version: int, error: StepFailed, replicas: list[str]) -> None:
    try:
        mesh.push_weights(version=version, replicas=replicas)
    except ServiceError as e:  # a given rollout that never went away holds these weights already
        if e.code != grpc.StatusCode.FAILED_PRECONDITION:
            raise StepFailed(f"{error}; pushing weights to the rollout that came back failed: {e}") from None


def answers(client) -> bool:
    try:
        return client.health(timeout=3) == "SERVING"
    except ServiceError:
        return False


def between_steps(mesh: Mesh, role: str) -> bool:
    """Whether a trained service's weights are between two steps (an Update stopped halfway)."""
    try:
        return bool(mesh[role].describe(timeout=10).details.get("partial"))
    except ServiceError:
        return False


def torn_weights(mesh: Mesh, replica: str) -> bool:
    """Whether a rollout replica holds part of a bucketed weight update that broke off (it refuses to
    generate)."""
    if replica not in mesh.clients:  # being started again (heal_fleet)
        return False
    try:
        return mesh[replica].describe(timeout=10).details.get("torn") == "true"
    except ServiceError:
        return False
