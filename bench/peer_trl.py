"""TRL's GRPOTrainer on the main job's task, for bench/peer_bench.py; runs in a venv with trl installed.

    PYTHON bench/peer_trl.py MODEL TRAIN.parquet TEST.parquet STEPS OUT.json [--val-every 20]
        [--optimizer-steps K] [--lr LR] [--seed S]

Same settings as configs/arithmetic_grpo.yaml: 32 prompts x 8 samples a step, up to 8 new tokens,
temperature 1, constant lr, token-mean PPO-clip loss (TRL's "dapo"), fp32, no KL; the reward is the
arithmetic scorer's rule (first line of the answer, as an integer, equals the ground truth).
--optimizer-steps 1 (TRL's settings): one optimizer step per batch over micro-batches of 64.
--optimizer-steps K: TRL's steps_per_generation=K, an optimizer step per 256/K samples (the config's
mini-batches), with the old log-prob pass TRL then runs. A step here is one batch (K of TRL's optimizer
steps). Writes per-step seconds (without the held-out evaluation, which runs between steps), the time
to the first step, held-out greedy accuracy, and what TRL logs at every optimizer step (loss, reward,
clip ratios, grad norm, entropy: "logs").
"""

import json
import time

T0 = time.perf_counter()

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from peer_common import accuracy, arguments, correct, rows  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def reward(completions, ground_truth, **_):
    return [
        1.0 if correct(c[0]["content"] if isinstance(c, list) else c, t) else 0.0
        for c, t in zip(completions, ground_truth)
    ]


class Timing(TrainerCallback):
    """Seconds per batch: the sum of its `per_batch` optimizer steps (TRL's global steps)."""

    def __init__(self, tokenizer, test, val_every, per_batch):
        self.tok, self.test, self.val_every, self.per_batch = tokenizer, test, val_every, per_batch
        self.steps, self.val, self.first_step_at, self.batch_s = [], {}, None, 0.0
        self.logs: list[dict] = []  # what TRL logs, every optimizer step (logging_steps=1)

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.val[0] = accuracy(model, self.tok, self.test)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.logs.append({"step": state.global_step, **logs})

    def on_step_begin(self, args, state, control, **kw):
        self.t = time.perf_counter()
        if self.first_step_at is None:
            self.first_step_at = self.t - T0

    def on_step_end(self, args, state, control, model=None, **kw):
        self.batch_s += time.perf_counter() - self.t
        if state.global_step % self.per_batch:
            return
        self.steps.append(self.batch_s)
        self.batch_s = 0.0
        batches = state.global_step // self.per_batch
        if batches % self.val_every == 0:
            self.val[batches] = accuracy(model, self.tok, self.test)


def main():
    a = arguments()
    k = a.optimizer_steps
    assert k in (1, 2, 4), "--optimizer-steps: 1, 2 or 4 (a quarter of the batch a micro-batch, 4 // K accumulated)"
    assert a.prompts * a.samples % 4 == 0, "--prompts x --samples must split into four micro-batches"
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
    cfg = GRPOConfig(
        output_dir="/tmp/peer_trl_out",
        max_steps=a.steps * k,
        per_device_train_batch_size=a.prompts * a.samples // 4,
        gradient_accumulation_steps=4 // k,
        steps_per_generation=4,  # one generation of a batch's prompts x samples (64 x 4 = 256 by default)
        num_generations=a.samples,
        max_completion_length=a.max_new_tokens,
        temperature=1.0,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        loss_type="dapo",
        num_iterations=1,
        epsilon=0.2,
        max_grad_norm=1.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=a.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    timing = Timing(tok, rows(a.test), a.val_every, k)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=Dataset.from_list(rows(a.train)),
        processing_class=tok,
        callbacks=[timing],
    )
    trainer.train()
    json.dump(
        {
            "step_s": timing.steps,
            "first_step_at_s": timing.first_step_at,
            "val": timing.val,
            "logs": timing.logs,
            "whole_s": time.perf_counter() - T0,
            "threads": torch.get_num_threads(),
        },
        open(a.out, "w"),
    )


if __name__ == "__main__":
    main()
