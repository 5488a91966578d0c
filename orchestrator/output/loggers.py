"""Where a run's numbers and sample generations go while it runs.

    with RunLog(run_dir, ["console", "tensorboard", "wandb", "mlflow"], config, name="grpo") as log:
        log.write(step, metrics)          # metrics.jsonl always, and every sink asked for
        log.write(step, metrics, correct) # ... and val.jsonl: which held-out problems were answered right
        log.write_samples(step, rows)     # samples.jsonl always: prompt, response, score, extras

metrics.jsonl, val.jsonl and samples.jsonl are appended (a resumed run continues them). Every step is
logged once: a run that goes back to a checkpoint (in-run recovery, or trainer.resume) first drops what
was logged after it from the files, TensorBoard's event files included (rewritten without those events,
and a purge_step event for a TensorBoard that has already read them), and does not send W&B and MLflow,
which cannot take points back, a step they already have (the redone step's values match the first
reading in a deterministic run; the files keep the redone ones). TensorBoard gets
scalars and a text table of the samples; Weights & Biases and MLflow get the same through their own
clients. Both run offline by default, writing under the run folder (run_dir/wandb, run_dir/mlruns); their
usual environment variables (WANDB_MODE, WANDB_PROJECT, MLFLOW_TRACKING_URI)
point them at a server instead. "console" is the progress bar (run/trainer.py).
"""

import hashlib
import json
import math
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Protocol


def scalars(metrics: dict) -> dict[str, float]:
    """The finite numbers of a metrics dict (loggers refuse NaN, strings and the like)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def plain(value):
    """A JSON value: numpy scalars (columns arrive as numpy arrays) become Python ones; others stay or
    become text."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return value
    return str(value)


def samples_markdown(rows: list[dict]) -> str:
    """A markdown table of sample rows (TensorBoard renders markdown in its text tab)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", "\\n")  # noqa: E731 - one row of markdown
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


class Sink(Protocol):
    """A logger the run's numbers and samples also go to (besides the jsonl files)."""

    can_purge: bool  # purge_after can take back what it has of later steps (else it raises)

    def metrics(self, step: int, values: dict[str, float]) -> None: ...
    def samples(self, step: int, rows: list[dict]) -> None: ...
    def purge_after(self, step: int) -> None: ...
    def close(self) -> None: ...


def drop_events_after(folder: pathlib.Path, step: int) -> None:
    """Drop the events of steps after `step` from the TensorBoard event files in `folder`, as the jsonl
    files drop their lines: a file is rewritten whole (under another name, then renamed), and one left
    with nothing but its file_version header goes. Readers other than TensorBoard (tbparse, pandas, a
    script over the records) then see each step once."""
    # tensorboard (torch.utils.tensorboard's writer) ships no type information
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader  # type: ignore[import-untyped]
    from tensorboard.compat.proto.event_pb2 import Event  # type: ignore[import-untyped]
    from tensorboard.summary.writer.record_writer import RecordWriter  # type: ignore[import-untyped]

    for path in sorted(folder.glob("events.out.tfevents.*")):
        records = [(r, Event.FromString(r)) for r in RawEventFileLoader(str(path)).Load()]
        kept = [(r, e) for r, e in records if e.step <= step]
        if len(kept) == len(records):
            continue
        if all(e.HasField("file_version") for _, e in kept):
            path.unlink()
            continue
        partial = folder / "purging"  # no "tfevents" in the name: TensorBoard never reads it
        with open(partial, "wb") as f:
            writer = RecordWriter(f)
            for r, _ in kept:
                writer.write(r)
        os.replace(partial, path)


class TensorBoardSink:
    can_purge = True  # the events past a purge step are dropped from the files (drop_events_after)

    def __init__(self, run_dir: pathlib.Path, config: dict, name: str, purge_step: int | None = None):
        self.folder = run_dir / "tensorboard"
        self.writer = self._open(purge_step)

    def _open(self, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        if purge_step is not None and self.folder.is_dir():
            drop_events_after(self.folder, purge_step - 1)
        # purge_step also writes an event that makes a TensorBoard already showing the dropped points
        #   (watching the run live) hide them
        return SummaryWriter(str(self.folder), purge_step=purge_step)

    def purge_after(self, step: int) -> None:
        self.writer.close()
        self.writer = self._open(step + 1)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def samples(self, step: int, rows: list[dict]) -> None:
        self.writer.add_text("samples", samples_markdown(rows), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    can_purge = False

    def __init__(self, run_dir: pathlib.Path, config: dict, name: str, purge_step: int | None = None):
        import wandb

        # resume="allow" with the folder's own id: a resumed run continues the same W&B run
        run_id = "meshrl-" + hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "meshrl"),
            name=f"{name}-{run_dir.name}",
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
            # as the user set it: wandb checks it (its settings take "dryrun" too, which init's annotation omits)
            mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
        )

    def purge_after(self, step: int) -> None:
        raise NotImplementedError("W&B cannot take logged points back")

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def samples(self, step: int, rows: list[dict]) -> None:
        import wandb

        keys = list(dict.fromkeys(k for r in rows for k in r))
        table = wandb.Table(columns=keys, data=[[str(r.get(k, "")) for k in keys] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    can_purge = False

    def __init__(self, run_dir: pathlib.Path, config: dict, name: str, purge_step: int | None = None):
        import mlflow

        self.mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # offline: a folder in the run (MLflow 3 keeps its file store behind this switch)
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "meshrl"))
        previous = run_dir / "mlruns_run_id"  # a resumed run continues the same MLflow run
        run_id = previous.read_text().strip() if previous.is_file() else None
        self.run = mlflow.start_run(run_id=run_id, run_name=None if run_id else f"{name}-{run_dir.name}")
        previous.write_text(self.run.info.run_id)
        if run_id is None:
            mlflow.log_params({k: str(v)[:500] for k, v in flatten(config).items()})

    def purge_after(self, step: int) -> None:
        raise NotImplementedError("MLflow cannot take logged points back")

    def metrics(self, step: int, values: dict[str, float]) -> None:
        # MLflow's metric names allow '/', '-', '.', '_', ' ', letters and digits
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in values.items()}, step=step)

    def samples(self, step: int, rows: list[dict]) -> None:
        self.mlflow.log_dict({"step": step, "rows": rows}, f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


# each made with (run_dir, the run's config, its name, the step TensorBoard purges from or None)
SINKS: dict[str, Callable[[pathlib.Path, dict, str, int | None], Sink]] = {
    "tensorboard": TensorBoardSink,
    "wandb": WandbSink,
    "mlflow": MlflowSink,
}


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class RunLog:
    """`after`: this run goes on from step `after` (a resume; -1: a fresh run in this folder), so what the
    folder logged past it is dropped first; None: append to whatever is there."""

    def __init__(
        self,
        run_dir: pathlib.Path,
        loggers: Sequence[str] = ("tensorboard",),
        config: dict | None = None,
        name: str = "run",
        after: int | None = None,
    ):
        self.run_dir = run_dir
        self.logged_through = -1  # the sinks that cannot take points back already have steps up to this
        purge = None
        if after is not None:
            self.logged_through = self._drop_after(after)
            purge = after + 1 if self.logged_through > after else None
        self.file = open(run_dir / "metrics.jsonl", "a")
        self.samples_file = open(run_dir / "samples.jsonl", "a")
        # preflight.check has made sure the packages the loggers need are installed
        self.sinks = [SINKS[key](run_dir, config or {}, name, purge) for key in loggers if key in SINKS]

    def _sinks_for(self, step: int) -> list[Sink]:
        return [s for s in self.sinks if s.can_purge or step > self.logged_through]

    def write(self, step: int, metrics: dict, correct: list[bool] | None = None) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()
        if correct is not None:  # one character per held-out problem, in file order: a paired comparison
            with open(self.run_dir / "val.jsonl", "a") as f:  # of two steps needs no more (report.py)
                f.write(json.dumps({"step": step, "correct": "".join("01"[c] for c in correct)}) + "\n")
        values = scalars(metrics)
        for sink in self._sinks_for(step):
            sink.metrics(step, values)

    def _drop_after(self, step: int) -> int:
        """Drop the lines of steps after `step` from the jsonl files; the last step they held (-1: none)."""
        last = -1
        for name in ("metrics.jsonl", "val.jsonl", "samples.jsonl"):
            path = self.run_dir / name
            if path.is_file():
                lines = path.read_text().splitlines(keepends=True)
                steps = [json.loads(line)["step"] for line in lines]
                last = max([last, *steps])
                kept = path.with_suffix(".kept")  # whole or not at all for a reader of the file
                kept.write_text("".join(line for line, s in zip(lines, steps) if s <= step))
                os.replace(kept, path)
        return last

    def forget_after(self, step: int) -> None:
        """Drop what was logged for steps after `step` (a run going back to its checkpoint redoes them),
        so that every step is logged once."""
        self.file.close()
        self.samples_file.close()
        self.logged_through = max(self.logged_through, self._drop_after(step))
        self.file = open(self.run_dir / "metrics.jsonl", "a")
        self.samples_file = open(self.run_dir / "samples.jsonl", "a")
        for sink in self.sinks:
            if sink.can_purge:
                sink.purge_after(step)

    def write_samples(self, step: int, rows: list[dict]) -> None:
        if not rows:
            return
        rows = [{k: plain(v) for k, v in r.items()} for r in rows]
        for r in rows:
            self.samples_file.write(json.dumps({"step": step, **r}) + "\n")
        self.samples_file.flush()
        for sink in self._sinks_for(step):
            sink.samples(step, rows)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.file.close()
        self.samples_file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
