"""The command line of a small GRPO run on the tiny task (HF rollout, one reward worker, 4 prompts x 2
samples, no validation, console only), for the e2e tests that watch a whole `meshrl grpo` process."""

import sys


def grpo_command(tiny_lm, arithmetic_data, run_dir, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cli", "grpo", f"actor.model={tiny_lm}",
            f"data.train_files={arithmetic_data['train']}", f"trainer.run_dir={run_dir}",
            f"trainer.total_steps={steps}", "trainer.val_every=0", "trainer.logger=[console]", "trainer.trace=",
            "rollout.backend=hf", "reward.workers=1", "data.train_batch_size=4", "rollout.n=2", *extra]  # fmt: skip
