"""The loop every algorithm shares: start the mesh, resume, step, validate, checkpoint, report.

    run(cfg, algorithm)

An algorithm (policy_gradient, dpo, sft) says which services it needs and which
of them it trains, and does one step given the step's prompts. Everything else
lives here, so a run of any algorithm can be killed and resumed the same way
(orchestrator.checkpoints) and recovers from lost services the same way
(orchestrator.recovery). The weight version the rollout runs is the step number.
"""

import contextlib
import dataclasses
import functools
import logging
import os
import pathlib
import time
import types
from typing import Protocol

import torch
from tqdm import tqdm

from meshrl import telemetry
from meshrl.errors import ServiceError
from meshrl.rpc.token import PEER_VAR, forget_run_token, run_token
from orchestrator import chunks, multi_turn, pipeline, preflight
from orchestrator.agreement import agree
from orchestrator.checkpoints import link_final_model, resume, save
from orchestrator.config import Config, save_config
from orchestrator.data import PromptDataset, prepare_run, prompt_limit
from orchestrator.loggers import RunLog
from orchestrator.mesh import Mesh, prompt_text, start_mesh, wanted
from orchestrator.recovery import StepFailed, check_not_ahead, recover, snapshot
from orchestrator.report import finish_report, standard_error
from orchestrator.services import Services

__all__ = ["Algorithm", "RunInterrupted", "StepFailed", "Timer", "run", "sample_and_score", "score_metrics"]

log = logging.getLogger(__name__)
BAR_KEYS = {
    "critic/score/mean": "score",
    "critic/acc/mean": "acc",
    "actor/sft_loss": "loss",
    "actor/dpo_loss": "dpo_loss",
}


class Algorithm(Protocol):
    name: str
    trained: tuple[str, ...]  # roles whose checkpoints make up a run's state

    def setup(self, cfg: Config) -> set[str]:
        """Check the config, (re)set the algorithm's own state; the services (roles) it needs."""

    def step(
        self, mesh: Mesh, number: int, data: PromptDataset, indices: list[int], uids: list[str]
    ) -> dict[str, float]: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class Timer(dict):
    """timing_s/<phase> seconds, as verl names them; each phase is also a span of the step's trace."""

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        with telemetry.span(phase):
            yield
        self[f"timing_s/{phase}"] = self.get(f"timing_s/{phase}", 0.0) + time.perf_counter() - start


def sampling_seed(cfg: Config, number: int) -> int:
    """Step `number` samples with its own seed, so a resumed run samples what an uninterrupted one would."""
    return cfg.trainer.seed * 1_000_003 + number


def sample_and_score(mesh: Mesh, t: Timer, number: int, prompts):
    """The first two phases of every RL step: rollout.n responses per prompt (the step's seed), scored.
    With trainer.max_staleness >= 1 the producer did them ahead: this waits for them (timing_s/wait_batch),
    and the step's metrics get their times and staleness (mesh.async_metrics)."""
    if mesh.producer is not None:
        with t("wait_batch"):
            gen, scored, seconds, version = mesh.producer.take(number)
        mesh.async_metrics = {
            **seconds,
            "async/weight_version": float(version),
            "async/staleness": float(number - 1 - version),
        }
    else:
        gen, scored, seconds = sample(mesh, number, prompts)
        t.update(seconds)
    mesh.last_sampled = (gen, scored)
    return gen, scored


def sample(mesh: Mesh, number: int, prompts, on_generated=None) -> tuple:
    """(gen, scored, timing_s/gen and timing_s/reward) of step `number`; on_generated(number) in between."""
    if mesh.cfg.rollout.multi_turn:  # episodes in the environment service
        gen, scored, seconds = multi_turn.sample(mesh, prompts, sampling_seed(mesh.cfg, number), mesh.tokenizer)
        if on_generated is not None:
            on_generated(number)
        return gen, scored, {f"timing_s/{k}": v for k, v in seconds.items()}
    if mesh.cfg.rollout.chunks > 1:  # concurrent calls, each scored as it returns
        gen, scored, seconds = chunks.sample(
            mesh, prompts, sampling_seed(mesh.cfg, number), on_generated and (lambda: on_generated(number))
        )
        return gen, scored, {f"timing_s/{k}": v for k, v in seconds.items()}
    t = Timer()
    with t("gen"):
        gen = mesh.generate(prompts, seed=sampling_seed(mesh.cfg, number))
    if on_generated is not None:
        on_generated(number)
    with t("reward"):
        scored = mesh.score(gen)
    return gen, scored, dict(t)


def accuracy(scored) -> float | None:
    acc = scored.columns.get("acc")
    return None if acc is None else float(sum(bool(x) for x in acc) / len(scored.scores))


def score_metrics(scored) -> dict[str, float]:
    """critic/score/{mean,max,min}, critic/acc/mean, and what the reward service reported: reward/num_failed
    (warned about when not 0: those samples got reward.error_score), reward/<extra>/mean, ..."""
    s = scored.scores
    out = {
        "critic/score/mean": s.mean().item(),
        "critic/score/max": s.max().item(),
        "critic/score/min": s.min().item(),
        **{k: float(v) for k, v in scored.metrics.items()},
    }
    acc = accuracy(scored)
    if acc is not None:
        out["critic/acc/mean"] = acc
    failed = int(out.get("reward/num_failed", 0))
    if failed:
        errors = [e for e in scored.columns.get("reward_error", []) if e]
        log.warning(
            "%d of %d samples failed to score and got the error score%s",
            failed,
            len(s),
            f"; first error: {errors[0]}" if errors else "",
        )
    return out


def sample_rows(gen, scored, k: int) -> list[dict]:
    """The first k samples of a step as the run's sample log keeps them: prompt, response, score, the
    ground truth, and the scorer's per-sample extras (acc, pred, reward_status, ...)."""
    cols = gen.non_tensor_batch
    rows = []
    for i in range(min(k, len(scored.scores))):
        row = {
            "prompt": prompt_text(cols["prompt"][i]) if "prompt" in cols else "",
            "response": cols["response_text"][i],
            "score": round(scored.scores[i].item(), 6),
        }
        truth = (cols["reward_model"][i] or {}).get("ground_truth") if "reward_model" in cols else None
        if truth is not None:
            row["ground_truth"] = truth
        row.update(
            {key: values[i] for key, values in scored.columns.items() if not (key == "reward_error" and not values[i])}
        )
        rows.append(row)
    return rows


def every(n: int, number: int) -> bool:
    """Step `number` is one of every n-th (n = 0: none)."""
    return n > 0 and number % n == 0


def answers(mesh: Mesh, prompts, seed: int = 0, n: int | None = None, greedy: bool = False):
    """Scores of n answers to each prompt (greedy: one): one Generate, or with rollout.multi_turn episodes."""
    if mesh.cfg.rollout.multi_turn:
        return multi_turn.sample(mesh, prompts, seed, mesh.tokenizer, n=n, greedy=greedy)[1]
    return mesh.score(mesh.generate(prompts, seed=seed, n=n, greedy=greedy))


def validate(cfg: Config, mesh: Mesh, data: PromptDataset) -> tuple[dict[str, float], list[bool] | None]:
    """Greedy answers to every held-out prompt (val/acc/mean with its standard error val/acc/se,
    val/score/mean); with trainer.val_k > 1 also k sampled answers each: val/acc/mean@k (mean over samples)
    and val/acc/best@k (any right). Also each prompt's greedy answer right or not (None: no `acc` column),
    which the run log keeps so a gain can be measured problem by problem (orchestrator.report)."""
    rows = list(range(len(data)))
    size = max(1, cfg.data.val_batch_size)
    out, greedy, sampled = {}, [], []
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        prompts = data.batch(part, [f"val-{i}" for i in part])
        greedy.append(answers(mesh, prompts, greedy=True))
        if cfg.trainer.val_k > 1:
            sampled.append(answers(mesh, prompts, seed=cfg.trainer.seed + 7, n=cfg.trainer.val_k))
    out["val/score/mean"] = torch.cat([s.scores for s in greedy]).mean().item()
    correct = None
    if any(s.columns.get("acc") is not None for s in greedy):  # an episode cut short reports none: wrong
        correct = [bool(x) for s in greedy for x in s.columns.get("acc", [False] * len(s.scores))]
        p = sum(correct) / len(correct)
        out["val/acc/mean"], out["val/acc/se"] = p, standard_error(p, len(correct))
    if sampled:
        k = cfg.trainer.val_k
        scores = torch.cat([s.scores for s in sampled]).view(-1, k)  # rows come back prompt by prompt
        out[f"val/score/mean@{k}"] = scores.mean().item()
        if any(s.columns.get("acc") is not None for s in sampled):
            acc = torch.tensor(
                [bool(x) for s in sampled for x in s.columns.get("acc", [False] * len(s.scores))], dtype=torch.float
            ).view(-1, k)
            out[f"val/acc/mean@{k}"] = acc.mean().item()
            out[f"val/acc/best@{k}"] = acc.max(-1).values.mean().item()
    return out, correct


def trace_env(cfg: Config, run_dir: pathlib.Path) -> None:
    """Tracing settings in the environment, which the services this process starts inherit."""
    if cfg.trainer.trace:
        os.environ.update(MESHRL_TRACE=cfg.trainer.trace, MESHRL_TRACE_DIR=str((run_dir / "traces").resolve()))
    else:
        os.environ.pop("MESHRL_TRACE", None)


def one_step(
    cfg: Config, mesh: Mesh, algorithm: Algorithm, number: int, data, batch, val, metrics_log: RunLog, extra: dict
) -> dict[str, float]:
    """Step `number` on `batch` (indices, uids), its validation and its log lines (with `extra`);
    StepFailed when a service fails or answers something unusable."""
    start = time.perf_counter()
    indices, uids = batch
    try:
        with telemetry.span("step", step=number, algorithm=algorithm.name, prompts=len(indices)) as s:
            metrics = algorithm.step(mesh, number, data, indices, uids)
            metrics.update(mesh.async_metrics)
            mesh.async_metrics = {}
            s.set_attribute("meshrl.weight_version", number)
            s.set_attribute(
                "meshrl.response_tokens",
                metrics.get("response_length/mean", 0.0) * len(indices) * max(1, cfg.rollout.n),
            )
        metrics["timing_s/step"] = time.perf_counter() - start
        telemetry.record_step(metrics)
        correct = None
        if val is not None and (every(cfg.trainer.val_every, number) or number == cfg.trainer.total_steps):
            held_out, correct = validate(cfg, mesh, val)
            metrics.update(held_out)
    except (ServiceError, ValueError) as e:  # a service failed or answered something unusable
        raise StepFailed(f"step {number} failed: {e}") from None
    metrics.update(extra)
    metrics_log.write(number, metrics, correct)
    if mesh.last_sampled is not None:
        metrics_log.write_samples(number, sample_rows(*mesh.last_sampled, cfg.trainer.samples_per_step))
        mesh.last_sampled = None
    return metrics


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


class RunInterrupted(Exception):
    """Ctrl-C (SIGINT): the run stopped where it was, its services stopped after it."""


def resume_hint(run_dir: pathlib.Path, done: int) -> str:
    return (
        f"the last checkpoint is step {done} in {run_dir / 'checkpoints'}{'' if done else ' (none yet)'}: "
        "rerun with trainer.resume=true to continue"
    )


def run(cfg: Config, algorithm: Algorithm) -> pathlib.Path:
    """Train; returns the run folder (config.yaml, metrics.jsonl, tensorboard/, checkpoints/, hf,
    curves.png, summary.md)."""
    roles = algorithm.setup(cfg)
    if cfg.trainer.max_staleness and algorithm.name not in pipeline.ALGORITHMS:
        raise ValueError(
            f"trainer.max_staleness={cfg.trainer.max_staleness} samples ahead for "
            f"{', '.join(pipeline.ALGORITHMS)}; {algorithm.name} runs synchronously: set it to 0"
        )
    preflight.check(cfg, roles)  # before any service starts
    trace_env(cfg, pathlib.Path(cfg.trainer.run_dir))
    telemetry.setup("meshrl-orchestrator")
    services = Services()
    done, token_made, mesh = 0, False, None
    run_dir = pathlib.Path(cfg.trainer.run_dir)
    try:
        ours = wanted(cfg, roles)
        given = {role for role, (address, _) in ours.items() if address}
        token_made = run_token()  # the services this run starts answer no caller without the run's token
        if token_made:
            keep_token_from(given, set(ours) - given, services)
        services.spawn_all(ours)  # they start while this process reads the data
        run_dir, tokenizer, data, sampler = prepare_run(cfg)
        val = None
        if cfg.data.val_files and "rollout" in roles:
            val = PromptDataset(
                cfg.data.val_files, tokenizer, prompt_limit(cfg), cfg.data.prompt_key, key="data.val_files"
            )
        torch.manual_seed(cfg.trainer.seed)
        mesh = start_mesh(cfg, services, roles)
        if agree(cfg, mesh, given):
            save_config(cfg, run_dir / "config.yaml")  # what was really used
        mesh.tokenizer = tokenizer
        first = resume(run_dir, mesh, algorithm, sampler) + 1 if cfg.trainer.resume else 1
        check_not_ahead(mesh, algorithm.trained, first - 1)
        done = first - 1
        total = cfg.trainer.total_steps
        # every step is logged once: what the folder holds past where this run starts is dropped (a fresh
        # run starts with validation at step 0, so it keeps nothing)
        with (
            RunLog(
                run_dir,
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
            if val is not None and first == 1:
                metrics, correct = validate(cfg, mesh, val)
                metrics_log.write(0, metrics, correct)
            start_state = snapshot(sampler, algorithm)  # where a run without a checkpoint goes back to
            number, batch, restarts = first, None, 0
            while number <= total:
                if cfg.trainer.max_staleness and mesh.producer is None:  # it draws the batches from here on
                    before = sampler.state_dict()
                    mesh.producer = pipeline.start(cfg, mesh, data, sampler, number)
                batch = batch or (mesh.producer.batch(number) if mesh.producer else sampler.next())
                try:
                    metrics = one_step(
                        cfg, mesh, algorithm, number, data, batch, val, metrics_log, {"trainer/restarts": restarts}
                    )
                    if every(cfg.trainer.save_every, number) or number == total and cfg.trainer.save_final:
                        drawn = (
                            sampler
                            if mesh.producer is None
                            else types.SimpleNamespace(
                                state_dict=functools.partial(mesh.producer.sampler_state, number)
                            )
                        )
                        try:
                            checkpoint = save(run_dir, number, mesh, algorithm, drawn, number == total)
                        except ServiceError as e:  # a half-written checkpoint is never "latest"
                            raise StepFailed(f"saving step {number} failed: {e}") from None
                        done = number
                        if number == total:
                            link_final_model(run_dir, checkpoint)
                except StepFailed as e:
                    restarts += 1
                    if mesh.producer is not None:  # nothing sampled ahead survives: draw again from `number`
                        producer, mesh.producer = mesh.producer, None
                        producer.stop()
                        sampler.load_state_dict(producer.states.get(number - 1, before))
                        batch = None
                    number, batch = recover(
                        e, restarts, number, batch, services, mesh, algorithm, sampler, metrics_log, start_state
                    )
                    bar.n = number - 1
                    continue
                bar.set_postfix({short: f"{metrics[k]:.3f}" for k, short in BAR_KEYS.items() if k in metrics})
                bar.update(1)
                number, batch = number + 1, None
        table = finish_report(run_dir)
        if table:
            print(f"\n{algorithm.name} run {run_dir}:\n{table}")
    except StepFailed as e:
        raise StepFailed(f"{e}; {resume_hint(run_dir, done)}") from None
    except KeyboardInterrupt:  # the services run in sessions of their own: they are still up, and stop below
        if (run_dir / "metrics.jsonl").is_file():
            finish_report(run_dir)  # the curves so far
        raise RunInterrupted(f"interrupted by the user; {resume_hint(run_dir, done)}") from None
    finally:
        if mesh is not None and mesh.producer is not None:
            mesh.producer.stop()
        services.stop()
        telemetry.shutdown()
        if token_made:
            forget_run_token()
    return run_dir
