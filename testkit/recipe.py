"""A bundled task's recipe run in-process, as the learning tests run it: the SFT warm-up and GRPO from it
(configs/<task>_sft.yaml and configs/<task>_grpo.yaml), held-out greedy accuracy checked at the start and
the end, on one plain actor rank; and the per-step metrics it logged."""

import json
import pathlib

from orchestrator.config import load_config
from orchestrator.main import run
from orchestrator.output.report import gain_line, held_out_gain

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMMON = ["actor.engine=plain", "actor.world_size=1", "reward.workers=1", "trainer.trace="]


def warm_up_and_grpo(task: str, tmp: pathlib.Path, model, data: dict, steps: int, *extra: str) -> pathlib.Path:
    """The GRPO run's folder, after the warm-up from `model` and `steps` GRPO steps with `extra` settings."""
    sft = run(
        "sft",
        load_config(
            str(ROOT / f"configs/{task}_sft.yaml"),
            [*COMMON, f"data.train_files={data['train']}", f"actor.model={model}", f"trainer.run_dir={tmp}/sft"],
        ),
    )
    files = [f"data.train_files={data['train']}", f"data.val_files={data['test']}", f"actor.model={sft / 'hf'}"]
    where = [f"trainer.run_dir={tmp / 'grpo'}", f"trainer.total_steps={steps}", f"trainer.val_every={steps}"]
    return run("grpo", load_config(str(ROOT / f"configs/{task}_grpo.yaml"), [*COMMON, *files, *where, *extra]))


def check_gain(grpo: pathlib.Path, held_out: int, gain_z: float) -> None:
    """Held-out accuracy over `held_out` rows rose by gain_z paired standard errors."""
    gain = held_out_gain(grpo)
    assert gain is not None and gain["n"] == held_out
    assert gain["gain"] > 0 and gain["gain"] >= gain_z * gain["gain_se"], gain_line(gain)


def steps_run(grpo: pathlib.Path) -> list[dict]:
    """Each step's metrics (step 0's line, the first validation alone, left out)."""
    lines = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["step"] > 0]


def timed_grpo(task: str, run_dir: pathlib.Path, model, train, steps: int, *extra: str) -> list[dict]:
    """A benchmark's GRPO run of configs/<task>_grpo.yaml: no validation, no checkpoints, console only; each
    step's metrics after step 0's line."""
    settings = [f"actor.model={model}", f"data.train_files={train}", f"trainer.run_dir={run_dir}"]
    quiet = ["trainer.val_every=0", "trainer.save_every=100000", "trainer.save_final=false"]
    where = ["trainer.logger=[console]", "trainer.trace=", f"trainer.total_steps={steps}"]
    done = run("grpo", load_config(str(ROOT / f"configs/{task}_grpo.yaml"), [*settings, *quiet, *where, *extra]))
    return [json.loads(line) for line in (done / "metrics.jsonl").read_text().splitlines()][1:]
