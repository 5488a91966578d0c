"""The loop every algorithm shares: start the mesh, resume, step, validate, checkpoint, report.

    run(cfg, algorithm)

An algorithm (orchestrator.loops) says which services it needs and which of
them it trains, and does one step given the step's prompts. Everything else
lives here, so a run of any algorithm can be killed and resumed the same way
(run.checkpoints) and recovers from lost services the same way (run.recovery).
What the run holds while it runs is one RunState (run.state); the weight version
the rollout runs is the step number.
"""

import dataclasses
import logging
import os
import pathlib
import time

import torch
from tqdm import tqdm

from meshrl import forkserver, modalities, telemetry
from meshrl.errors import ServiceError
from meshrl.rpc.token import PEER_VAR, forget_run_token, run_token
from orchestrator.agents.episode import close_runners
from orchestrator.agents.sandbox import close_sandboxes
from orchestrator.config import Config, save_config
from orchestrator.data import dataset, prepare_run
from orchestrator.lifecycle import preflight
from orchestrator.lifecycle.agreement import agree, same_tokenizer
from orchestrator.lifecycle.mesh import start_mesh
from orchestrator.lifecycle.roles import wanted
from orchestrator.lifecycle.services import Services
from orchestrator.loops.algorithm import Algorithm
from orchestrator.output.loggers import RunLog
from orchestrator.output.readings import sample_rows
from orchestrator.output.report import finish_report
from orchestrator.run import fleet, parity
from orchestrator.run.checkpoints import DiskFull, link_final_model, resume, save
from orchestrator.run.interrupt import Interrupts
from orchestrator.run.recovery import StepFailed, check_not_ahead, recover, snapshot
from orchestrator.run.state import RunState
from orchestrator.run.validation import validate
from orchestrator.sampling.partial import Partial

__all__ = ["RunInterrupted", "StepFailed", "run"]

log = logging.getLogger(__name__)
BAR_KEYS = {
    "critic/score/mean": "score",
    "critic/acc/mean": "acc",
    "actor/sft_loss": "loss",
    "actor/dpo_loss": "dpo_loss",
}


def every(n: int, number: int) -> bool:
    """Step `number` is one of every n-th (n = 0: none)."""
    return n > 0 and number % n == 0


def trace_env(cfg: Config, run_dir: pathlib.Path) -> None:
    """Tracing settings in the environment, which the services this process starts inherit."""
    if cfg.trainer.trace:
        os.environ.update(MESHRL_TRACE=cfg.trainer.trace, MESHRL_TRACE_DIR=str((run_dir / "traces").resolve()))
    else:
        os.environ.pop("MESHRL_TRACE", None)


def one_step(state: RunState) -> dict[str, float]:
    """Step state.number on state.batch (indices, uids), its validation and its log lines; StepFailed when a
    service fails or answers something unusable."""
    cfg, number, algorithm = state.cfg, state.number, state.algorithm
    start = time.perf_counter()
    assert state.batch is not None and state.log is not None  # train() drew the batch and opened the log
    indices, uids = state.batch
    rollouts = state.rollouts()
    try:
        with telemetry.span("step", step=number, algorithm=algorithm.name, prompts=len(indices)) as s:
            metrics = algorithm.step(state.mesh, rollouts, number, state.data, indices, uids)
            metrics.update(rollouts.metrics)
            state.parity.check(number, metrics)  # a push that broke the rollout stops the run here
            if len(state.mesh.replicas) > 1:
                metrics.update(state.mesh.fleet_metrics())
            s.set_attribute("meshrl.weight_version", number)
            s.set_attribute(
                "meshrl.response_tokens",
                metrics.get("response_length/mean", 0.0) * len(indices) * max(1, cfg.rollout.n),
            )
        metrics["timing_s/step"] = time.perf_counter() - start
        telemetry.record_step(metrics)
        correct = None
        if state.val is not None and (every(cfg.trainer.val_every, number) or number == cfg.trainer.total_steps):
            held_out, correct = validate(cfg, state.mesh, state.tokenizer, state.val, step=number)
            metrics.update(held_out)
    except (ServiceError, ValueError) as e:  # a service failed or answered something unusable
        raise StepFailed(f"step {number} failed: {e}") from None
    metrics["trainer/restarts"] = state.restarts
    state.log.write(number, metrics, correct)
    if rollouts.sampled is not None:
        state.log.write_samples(number, sample_rows(*rollouts.sampled, cfg.trainer.samples_per_step))
    return metrics


def save_if_due(state: RunState) -> None:
    """A checkpoint every trainer.save_every steps and (trainer.save_final) at the last, which the run
    folder's hf link then names; StepFailed when a service cannot save."""
    cfg, number = state.cfg, state.number
    total = cfg.trainer.total_steps
    if not (every(cfg.trainer.save_every, number) or number == total and cfg.trainer.save_final):
        return
    try:
        with telemetry.span("checkpoint", step=number):  # a failed save ends the span with its error
            checkpoint = save(
                state.run_dir,
                number,
                state.mesh,
                state.algorithm,
                sampler_state=state.sampler_state(number),
                last=number == total,
                carry=state.partial,
            )
    except DiskFull as e:  # nothing to recover from: the step's partial folder is gone, the hint says the rest
        raise StepFailed(e.strerror) from None
    except (ServiceError, OSError) as e:  # a half-written checkpoint is never "latest"
        raise StepFailed(f"saving step {number} failed: {e}") from None
    state.done = number
    if number == total:
        link_final_model(state.run_dir, checkpoint)


def keep_token_from(given: set[str], started: set[str], services: Services) -> None:
    """A token the run made is never sent to services given by address (meshrl.rpc.token); a given actor
    could then not push into a rollout the run starts, which the run says before anything starts."""
    if "actor" in given and "rollout" in started:
        raise ValueError(
            "actor.address is given and this run starts the rollout, which requires the run's "
            "token, so the actor's weight push would be refused: set MESHRL_TOKEN (or "
            "MESHRL_TOKEN_FILE) for the run and for that actor service"
        )
    if given:
        services.given_token = ""
        if "rollout" in given:
            os.environ[PEER_VAR] = ""  # the actor's weight push to it
        log.info(
            "%s given by address: called without a token (set MESHRL_TOKEN to share one with them)",
            ", ".join(sorted(given)),
        )


def start(cfg: Config, algorithm: Algorithm, roles: set[str], services: Services, given: set[str]) -> RunState:
    """The run folder, data, tokenizer and services (spawned already), the config compared with the given
    ones, and the latest checkpoint restored with trainer.resume: the state the first step starts from."""
    run_dir, tokenizer, data, sampler = prepare_run(cfg)
    val = None
    if cfg.data.val_files and "rollout" in roles:
        val = dataset(cfg, "val_files", tokenizer)
    modalities.check(cfg, roles, [d for d in (data, val) if d is not None])  # pictures where they cannot go
    torch.manual_seed(cfg.trainer.seed)
    mesh = start_mesh(cfg, services, roles, tokenizer)
    if agree(cfg, mesh, given):
        save_config(cfg, run_dir / "config.yaml")  # what was really used
    same_tokenizer(mesh)
    partial = Partial(cfg, data, tokenizer) if cfg.rollout.partial else None
    first = resume(run_dir, mesh, algorithm, sampler, partial) + 1 if cfg.trainer.resume else 1
    check_not_ahead(mesh, algorithm.trained, first - 1)
    return RunState(
        cfg,
        services,
        mesh,
        algorithm,
        tokenizer,
        data,
        sampler,
        val,
        number=first,
        done=first - 1,
        partial=partial,
        parity=parity.of(cfg),  # after agree(): the settings of services given by address, if adopted
    )


def train(state: RunState) -> None:
    """Steps state.number .. trainer.total_steps, each logged once, validated and saved as the config says;
    a failed step is recovered from (the run goes on from where recovery says) or raised."""
    cfg, algorithm = state.cfg, state.algorithm
    first, total = state.number, cfg.trainer.total_steps
    # every step is logged once: what the folder holds past where this run starts is dropped (a fresh
    # run starts with validation at step 0, so it keeps nothing)
    with (
        RunLog(
            state.run_dir,
            cfg.trainer.logger,
            dataclasses.asdict(cfg),
            algorithm.name,
            after=first - 1 if first > 1 else -1,
        ) as metrics_log,
        tqdm(
            total=total,
            initial=first - 1,
            desc=algorithm.name,
            unit="step",
            disable="console" not in cfg.trainer.logger,
        ) as bar,
    ):
        state.log = metrics_log
        if state.val is not None and first == 1:
            metrics, correct = validate(cfg, state.mesh, state.tokenizer, state.val, step=0)
            metrics_log.write(0, metrics, correct)
        state.start = snapshot(state.sampler, algorithm, state.partial)  # where a run without a checkpoint goes back to
        while state.number <= total:
            fleet.tend(state)  # replicas set aside in the last step come back, fleet.json's changes are made
            state.sample_ahead()  # from here on the producer draws the batches
            state.draw()
            try:
                metrics = one_step(state)
                save_if_due(state)
                if state.partial is not None:  # the step stands (and its checkpoint): the next starts from its carry
                    state.partial.commit()
            except StepFailed as e:
                state.restarts += 1
                state.parity.restart()  # the pushes recovery makes start the comparison again
                state.stop_sampling_ahead()  # nothing sampled ahead survives: drawn again from this step
                state.number, state.batch = recover(e, state)
                bar.n = state.number - 1
                continue
            bar.set_postfix({short: f"{metrics[k]:.3f}" for k, short in BAR_KEYS.items() if k in metrics})
            bar.update(1)
            state.number, state.batch = state.number + 1, None


class RunInterrupted(Exception):
    """Ctrl-C (SIGINT): the run stopped where it was, its services stopped after it."""


def resume_hint(run_dir: pathlib.Path, done: int) -> str:
    return (
        f"the last checkpoint is step {done} in {run_dir / 'checkpoints'}{'' if done else ' (none yet)'}: "
        "rerun with trainer.resume=true to continue"
    )


def stop_all(state: RunState | None, services: Services) -> None:
    """The way out of every run: sampling ahead told to stop, the services stopped (their calls in flight
    then end), the producer given a moment to notice, the fork server and the tracer closed."""
    producer = state.producer if state is not None else None
    if producer is not None:
        producer.stop(wait=0)
    close_runners()  # agent workers first: their calls would only wait on stopping services
    close_sandboxes()
    services.stop()
    if producer is not None:
        producer.stop(wait=5)
    forkserver.stop()
    try:
        telemetry.shutdown()
    except OSError as e:  # a full disk under the trace files: said, and the run's own outcome stands
        log.warning("closing the traces: %s", e)


def run(cfg: Config, algorithm: Algorithm) -> pathlib.Path:
    """Train; returns the run folder (config.yaml, metrics.jsonl, tensorboard/, checkpoints/, hf,
    curves.png, summary.md)."""
    roles = algorithm.setup(cfg)
    preflight.check(cfg, roles)  # before any service starts
    run_dir = pathlib.Path(cfg.trainer.run_dir)
    trace_env(cfg, run_dir)
    telemetry.setup("meshrl-orchestrator")
    services = Services(forked=cfg.trainer.fork_server)
    token_made, state = False, None

    def kill() -> None:  # the stop of last resort: nothing waited for
        services.kill_all()
        close_runners(kill=True)
        close_sandboxes(kill=True)
        forkserver.kill()

    stop = Interrupts(
        f"meshrl {algorithm.name}", hint=lambda: resume_hint(run_dir, state.done if state else 0), kill=kill
    )
    with stop:  # Ctrl-C is said at once, a second one stops at once, and the way out below is bounded
        try:
            ours = wanted(cfg, roles)
            given = {role for role, (address, _) in ours.items() if address}
            if not cfg.trainer.fork_server or given == set(ours):
                forkserver.stop()  # `meshrl <algorithm>` started it before the config was read
            token_made = run_token()  # the services this run starts answer no caller without the run's token
            if token_made:
                keep_token_from(given, set(ours) - given, services)
            services.spawn_all(ours)  # they start while this process reads the data
            state = start(cfg, algorithm, roles, services, given)
            train(state)
            table = finish_report(run_dir)
            if table:
                print(f"\n{algorithm.name} run {run_dir}:\n{table}")
        except StepFailed as e:
            raise StepFailed(f"{e}; {resume_hint(run_dir, state.done if state else 0)}") from None
        except KeyboardInterrupt:  # the services run in sessions of their own: they are still up, and stop below
            if (run_dir / "metrics.jsonl").is_file():
                finish_report(run_dir)  # the curves so far
            hint = resume_hint(run_dir, state.done if state else 0)
            raise RunInterrupted(f"interrupted by the user; {hint}") from None
        finally:
            stop.arm()
            stop_all(state, services)
            if token_made:
                forget_run_token()
    return run_dir
