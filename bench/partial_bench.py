"""Partial rollouts (rollout.partial) against synchronous steps on a long-tailed response length: samples
trained per second (issue 46's benchmark).

The model: the tiny causal model (meshrl.tiny) with its end token made likelier through one hidden
dimension: the final norm's weight on dimension 0 is --eos-scale and the output head reads only the end
token from it, so each position's chance to end depends on its context. Sampled at temperature 1 the
lengths have a long tail (with scale 2: median 8 tokens, 90th percentile ~90, a few at the 448-token
limit). Nothing is learned: the reward scores by length (testkit's VARIED) and the actor's learning rate
is 1e-9, so every step runs the whole update but the length distribution stays the model's (at a real
rate the length reward moves it within a few steps). Both modes train the same rows per step through
the same services (vLLM rollout, one actor rank, one reward worker).

samples/s counts the steps after the first: rows trained / the sum of their step times. Each mode starts
its own services; modes alternate over --repeats.

    .venv/bin/python bench/partial_bench.py [--steps 12] [--tokens 32] [--repeats 1] [--backend vllm]

--engine: no run; vLLM in this process generates one batch of the same shape (64 samples of up to 448 tokens)
in one call, then the same samples in rounds of --tokens (each unfinished one sent again from its tokens),
and prints both times and each round's, to see what a round costs in the engine itself.
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from meshrl.tiny.arithmetic import ArithmeticConfig, make_data  # noqa: E402
from meshrl.tiny.models import TinyModelConfig, make_model  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.main import run  # noqa: E402
from testkit.runs import VARIED  # noqa: E402

PROMPTS, N, LIMIT = 16, 4, 448


def long_tail_model(folder: pathlib.Path, scale: float) -> pathlib.Path:
    """The tiny causal model whose end token's logit is `scale` x its normalised hidden dimension 0."""
    path = make_model(folder, TinyModelConfig(kind="causal"))
    eos = json.loads((path / "config.json").read_text())["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    weights = load_file(path / "model.safetensors")
    head = weights["lm_head.weight"]
    head[:, 0] = 0.0
    head[eos, 0] = 1.0
    weights["model.norm.weight"][0] = scale
    save_file({k: v.contiguous() for k, v in weights.items()}, path / "model.safetensors", metadata={"format": "pt"})
    return path


def one_run(run_dir: pathlib.Path, model, data, reward, a, mode: str) -> dict:
    overrides = [
        f"actor.model={model}",
        f"data.train_files={data['train']}",
        f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={a.steps}",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "trainer.save_final=false",
        "trainer.logger=[]",
        "trainer.trace=",
        f"data.train_batch_size={PROMPTS}",
        f"rollout.n={N}",
        f"rollout.backend={a.backend}",
        "rollout.max_model_len=512",
        f"rollout.max_new_tokens={LIMIT}",
        "actor.engine=plain",
        "actor.world_size=1",
        "actor.micro_batch_tokens=16384",
        "actor.lr=1e-9",
        "reward.workers=1",
        f"reward.function={reward}:compute_score",
        "algorithm.rollout_is=token",
    ]
    if mode == "partial":
        overrides += ["rollout.partial=true", f"rollout.partial_tokens={a.tokens}", f"trainer.max_staleness={a.k}"]
    out = run("grpo", load_config(None, overrides))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r.get("step", 0) > 1]
    step_s = [r["timing_s/step"] for r in timed]
    return {
        "samples_per_s": PROMPTS * N * len(step_s) / sum(step_s),
        "gen": statistics.median(r["timing_s/gen"] for r in timed),
        "update": statistics.median(r["timing_s/update_actor"] for r in timed),
        "length": statistics.mean(r["response_length/mean"] for r in timed),
        "clip": statistics.mean(r["response_length/clip_ratio"] for r in timed),
        "rounds": statistics.mean(r.get("partial/rounds", 1.0) for r in timed),
        "dropped": sum(r.get("partial/dropped_groups", 0.0) for r in rows),
        "staleness": statistics.mean(r.get("async/staleness", 0.0) for r in timed),
    }


def engine_rounds(model: pathlib.Path, tokens: int) -> None:
    """One call against rounds of `tokens`, in an in-process vLLM engine (the rollout service's settings)."""
    import os
    import time

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import transformers
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tok = transformers.AutoTokenizer.from_pretrained(model)
    prompts = [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": f"{a}+{3 * a}="}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        ).input_ids
        for a in range(PROMPTS)
    ] * N
    llm = LLM(
        model=str(model),
        dtype="float32",
        max_model_len=512,
        seed=0,
        enforce_eager=True,
        enable_chunked_prefill=False,
        max_num_batched_tokens=8192,
    )

    def generate(rows: list[tuple[list[int], int]], most: int):
        params = [SamplingParams(max_tokens=most, temperature=1.0, seed=seed, logprobs=0) for _, seed in rows]
        return llm.generate([TokensPrompt(prompt_token_ids=ids) for ids, _ in rows], params, use_tqdm=False)

    generate([(prompts[0], 0)], 4)  # warm
    start = time.perf_counter()
    lengths = sorted(len(o.outputs[0].token_ids) for o in generate([(p, i) for i, p in enumerate(prompts)], LIMIT))
    one = time.perf_counter() - start
    going: list[tuple[list[int], list[int], int]] = [(p, [], i) for i, p in enumerate(prompts)]
    each: list[float] = []
    start = time.perf_counter()
    while going:
        t = time.perf_counter()
        outs = generate([(p + done, seed + 7 * len(each)) for p, done, seed in going], tokens)
        each.append(time.perf_counter() - t)
        going = [
            (p, done + list(o.outputs[0].token_ids), seed)
            for (p, done, seed), o in zip(going, outs)
            if o.outputs[0].finish_reason == "length" and len(done) + len(o.outputs[0].token_ids) < LIMIT
        ]
    rounds = time.perf_counter() - start
    block = llm.llm_engine.vllm_config.cache_config.block_size
    print(
        f"lengths: median {lengths[len(lengths) // 2]}, 90th percentile {lengths[9 * len(lengths) // 10]}, "
        f"max {lengths[-1]}; KV block {block} tokens"
    )
    print(
        f"one call: {one:.2f} s; rounds of {tokens}: {rounds:.2f} s in {len(each)} rounds "
        f"({', '.join(f'{x:.2f}' for x in each)} s)"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32, help="rollout.partial_tokens")
    ap.add_argument("--k", type=int, default=8, help="trainer.max_staleness for the partial runs")
    ap.add_argument("--eos-scale", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--engine", action="store_true", help="time one call against rounds in vLLM only")
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.engine:
        with tempfile.TemporaryDirectory() as tmp:
            engine_rounds(long_tail_model(pathlib.Path(tmp) / "model", a.eos_scale), a.tokens)
        return 0
    results: dict[str, list[dict]] = {"sync": [], "partial": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        model = long_tail_model(root / "model", a.eos_scale)
        data = make_data(root / "data", ArithmeticConfig(num_train=2000, num_test=10))
        reward = root / "varied.py"
        reward.write_text(VARIED)
        for i in range(a.repeats):
            for mode in results:
                results[mode].append(one_run(root / f"{mode}-{i}", model, data, reward, a, mode))
    base = statistics.median(r["samples_per_s"] for r in results["sync"])
    print(
        f"\n{a.steps} steps of {PROMPTS} prompts x {N} on the {a.backend} rollout, responses up to {LIMIT} tokens; "
        f"partial: {a.tokens} tokens a round, max_staleness {a.k}; {a.repeats} run(s) each"
    )
    print(
        "| mode | samples/s | x sync | gen / update_actor (median step) | mean length | clipped | rounds | "
        "mean staleness | dropped groups |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, runs in results.items():
        sps = statistics.median(r["samples_per_s"] for r in runs)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {mode} | {sps:.2f} | {sps / base:.2f} | {med['gen']:.2f} / {med['update']:.2f} s | "
            f"{med['length']:.1f} | {100 * med['clip']:.1f}% | {med['rounds']:.1f} | {med['staleness']:.2f} | "
            f"{med['dropped']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
