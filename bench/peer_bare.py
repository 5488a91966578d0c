"""A bare one-process GRPO loop on the main job's task, for bench/peer_bench.py: what the step costs
with nothing around it (HF generate, one forward-backward, AdamW), the floor the issue measures against.

    PYTHON bench/peer_bare.py MODEL TRAIN.parquet TEST.parquet STEPS OUT.json [--val-every 20] [--device cuda]

Same settings as bench/peer_trl.py: 32 prompts x 8 samples, up to 8 new tokens, temperature 1, constant
lr (--lr), token-mean PPO-clip loss, group-normalised advantages, micro-batches of 64 rows, grad clip 1,
fp32, no KL. --optimizer-steps 1: one optimizer step per batch, on-policy (the ratio against the pass's
own detached log-probs); K: K mini-batches, the ratio against an old log-prob pass over the batch.
Writes the same JSON as peer_trl.py, plus each step's generation and update seconds.
"""

import json
import random
import time

T0 = time.perf_counter()

import torch  # noqa: E402
from peer_common import accuracy, arguments, correct, encode, rows  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

MICRO = 64  # rows a forward-backward


def clock(device: torch.device) -> float:
    if device.type == "cuda":  # the GPU's work, not its queueing
        torch.cuda.synchronize(device)
    return time.perf_counter()


def step(model, tok, opt, batch: list[dict], *, optimizer_steps: int, n: int, new_tokens: int) -> dict[str, float]:
    """One GRPO step; seconds of its generation and of its update (reward and advantages between)."""
    device = model.device
    start = clock(device)
    enc = encode(tok, batch).to(device)
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=new_tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            num_return_sequences=n,
            pad_token_id=tok.pad_token_id,
        )
    generated = clock(device)
    P = enc["input_ids"].shape[1]
    responses = out[:, P:]
    texts = tok.batch_decode(responses, skip_special_tokens=True)
    truths = [r["ground_truth"] for r in batch for _ in range(n)]
    rewards = torch.tensor([float(correct(t, truth)) for t, truth in zip(texts, truths)], device=device)
    group = rewards.view(-1, n)
    adv = ((group - group.mean(1, keepdim=True)) / (group.std(1, keepdim=True) + 1e-6)).flatten()
    eos = (responses == tok.eos_token_id).int()
    resp_mask = ((eos.cumsum(1) - eos) == 0).float()  # up to the first end-of-sequence; padding after it
    mask = torch.cat([enc["attention_mask"].repeat_interleave(n, 0), resp_mask.long()], 1)
    update = clock(device)

    def logprobs(i: int) -> torch.Tensor:
        ids, m = out[i : i + MICRO], mask[i : i + MICRO]
        logits = model(input_ids=ids, attention_mask=m, position_ids=(m.cumsum(1) - 1).clamp(min=0)).logits
        return torch.log_softmax(logits[:, P - 1 : -1].float(), -1).gather(-1, responses[i : i + MICRO, :, None])[
            ..., 0
        ]

    old = None
    if optimizer_steps > 1:  # the ratio of every mini-batch after the first is against the batch's weights
        with torch.no_grad():
            old = torch.cat([logprobs(i) for i in range(0, len(out), MICRO)])
    rows = len(out) // optimizer_steps
    for first in range(0, len(out), rows):
        opt.zero_grad()
        tokens = resp_mask[first : first + rows].sum()
        for i in range(first, first + rows, MICRO):
            lp = logprobs(i)
            ratio = torch.exp(lp - (lp.detach() if old is None else old[i : i + MICRO]))
            a = adv[i : i + MICRO, None]
            loss = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
            ((loss * resp_mask[i : i + MICRO]).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    end = clock(device)
    return {"gen": generated - start, "update": end - update}


def main():
    a = arguments()
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(a.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    train, test = rows(a.train), rows(a.test)
    order = list(range(len(train)))
    random.Random(a.seed).shuffle(order)
    val, steps = {0: accuracy(model, tok, test)}, []
    phases: dict[str, list[float]] = {"gen": [], "update": []}
    first = time.perf_counter() - T0
    for s in range(1, a.steps + 1):
        start = (s - 1) * a.prompts % len(order)
        t = time.perf_counter()
        for phase, seconds in step(
            model,
            tok,
            opt,
            [train[i] for i in (order + order)[start : start + a.prompts]],
            optimizer_steps=a.optimizer_steps,
            n=a.samples,
            new_tokens=a.max_new_tokens,
        ).items():
            phases[phase].append(seconds)
        steps.append(clock(model.device) - t)
        if s % a.val_every == 0:
            val[s] = accuracy(model, tok, test)
    json.dump(
        {
            "step_s": steps,
            "phase_s": phases,
            "first_step_at_s": first,
            "val": val,
            "whole_s": time.perf_counter() - T0,
            "threads": torch.get_num_threads(),
        },
        open(a.out, "w"),
    )


if __name__ == "__main__":
    main()
