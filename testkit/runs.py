"""The command lines of small runs on the tiny task, for the tests and benchmarks that watch a whole
`meshrl grpo` process: a plain small GRPO run (grpo_command) and the self-healing run whose services are
killed under it (chaos_settings), with how to find a run's services and the steps it has logged."""

import json
import sys

import psutil


def grpo_command(tiny_lm, arithmetic_data, run_dir, steps: int, *extra: str) -> list[str]:
    """HF rollout, one reward worker, 4 prompts x 2 samples, no validation, console only."""
    return [sys.executable, "-m", "cli", "grpo", f"actor.model={tiny_lm}",
            f"data.train_files={arithmetic_data['train']}", f"trainer.run_dir={run_dir}",
            f"trainer.total_steps={steps}", "trainer.val_every=0", "trainer.logger=[console]", "trainer.trace=",
            "rollout.backend=hf", "reward.workers=1", "data.train_batch_size=4", "rollout.n=2", *extra]  # fmt: skip


VARIED = (  # an untrained model scores 0 on the task, and equal scores teach nothing: vary them by length
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return float(len(solution_str) % 3)\n"
)


def small_settings(tiny_lm, arithmetic_data, folder) -> list[str]:
    """4 prompts x 2 samples on the HF rollout and a plain actor (lr 1e-3), one reward worker scoring by
    length (VARIED, written into folder), so that every step trains."""
    varied = folder / "varied_reward.py"
    varied.write_text(VARIED)
    return [
        f"actor.model={tiny_lm}",
        f"data.train_files={arithmetic_data['train']}",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.backend=hf",
        "actor.engine=plain",
        "reward.workers=1",
        "actor.lr=1e-3",
        f"reward.function={varied}:compute_score",
    ]


def chaos_settings(tiny_lm, arithmetic_data, tmp_path, run_dir) -> list[str]:
    """A 12-step small run that checkpoints every 5 steps and may restart its services 3 times."""
    return [
        *small_settings(tiny_lm, arithmetic_data, tmp_path),
        "trainer.save_every=5",
        "trainer.total_steps=12",
        "trainer.val_every=0",
        "trainer.logger=[console]",
        "trainer.trace=",
        "trainer.max_restarts=3",
        f"trainer.run_dir={run_dir}",
    ]


def service(orchestrator: psutil.Process, name: str) -> psutil.Process:
    """The service's main process: `meshrl serve actor --role actor ...`, `meshrl serve rollout ...`."""
    for p in orchestrator.children(recursive=True):
        cmd = p.cmdline()
        if (
            "serve" in cmd
            and cmd[cmd.index("serve") + 1] == ("actor" if name == "actor" else name)
            and (name != "actor" or "--role" in cmd and cmd[cmd.index("--role") + 1] == "actor")
        ):
            return p
    raise AssertionError(f"no {name} service under the orchestrator")


def steps_logged(run_dir) -> list[int]:
    """The steps metrics.jsonl holds; read while the run writes it, so a last line not yet whole is left out."""
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line)["step"] for line in text[: text.rfind("\n") + 1].splitlines()]
