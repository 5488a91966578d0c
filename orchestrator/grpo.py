"""GRPO (Shao et al. 2024): sample n responses per prompt, score them, normalise scores within each
prompt's group, take a clipped policy-gradient step, push the new weights to the rollout.

    generate -> score -> advantages -> (ref log-probs) -> update -> push weights -> log -> checkpoint
"""

import json
import logging
import pathlib
import time

import torch
from tqdm import tqdm
from meshrl.algos.advantages import compute_grpo
from meshrl.algos.masked import masked_mean
from meshrl.clients import RewardClient
from meshrl.codec import Payload
from meshrl.codec.values import to_value
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.config import Config
from orchestrator.data import PromptDataset, Sampler, prepare_run
from orchestrator.services import Services, start_actor

log = logging.getLogger(__name__)
POLICY_TENSORS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


def start_services(cfg: Config, services: Services):
    a, r = cfg.actor, cfg.rollout
    actor = start_actor(cfg, services)
    rollout = services.start("rollout", r.address, [
        "rollout", "--model", a.model, "--backend", r.backend, "--max-model-len", str(r.max_model_len),
        "--seed", str(cfg.trainer.seed)])
    rw = cfg.reward
    reward_args = ["reward", "--workers", str(rw.workers), "--timeout", str(rw.timeout), "--on-error", rw.on_error]
    if rw.function:
        reward_args += ["--function", rw.function]
    reward = RewardClient(services.start("reward", rw.address, reward_args).address)
    ref = None
    if a.use_kl_loss:
        ref = services.start("ref", cfg.ref.address, ["actor", "--role", "ref", "--model", a.model,
                                                      "--world-size", str(cfg.ref.world_size)])
    return actor, rollout, reward, ref


def ppo_params(cfg: Config) -> dict:
    a = cfg.actor
    return {"epochs": a.ppo_epochs, "mini_batch_size": a.mini_batch_size, "clip_ratio_low": a.clip_ratio_low,
            "clip_ratio_high": a.clip_ratio_high, "clip_ratio_c": a.clip_ratio_c, "entropy_coeff": a.entropy_coeff,
            "use_kl_loss": a.use_kl_loss, "kl_loss_coef": a.kl_loss_coef, "kl_loss_type": a.kl_loss_type,
            "loss_agg_mode": a.loss_agg_mode, "temperature": cfg.rollout.temperature}


def step(cfg: Config, number: int, batch, actor, rollout, reward, ref) -> dict[str, float]:
    timing = {}
    t = time.perf_counter()
    r = cfg.rollout
    sampling = rollout_pb2.SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                          max_new_tokens=r.max_new_tokens, logprobs=True,
                                          seed=cfg.trainer.seed * 1_000_003 + number)  # a resumed run samples alike
    gen = rollout.call("Generate", Payload(rollout_pb2.GenerateRequest(sampling=sampling), batch)).data
    timing["timing_s/gen"] = time.perf_counter() - t

    t = time.perf_counter()
    scored = reward.score(gen)
    timing["timing_s/reward"] = time.perf_counter() - t

    mask = gen.batch["response_mask"]
    advantages, _ = compute_grpo(scored.token_level_scores, mask, list(gen.non_tensor_batch["uid"]),
                                 norm_by_std=cfg.algorithm.norm_adv_by_std)
    policy = gen.select(POLICY_TENSORS)
    t = time.perf_counter()
    policy.batch["actor_logprobs"] = actor.call("ComputeLogProbs", Payload(actor_pb2.BatchRequest(
        temperature=r.temperature), policy.select(POLICY_TENSORS[:4]))).data.batch["actor_logprobs"]
    if ref is not None:
        policy.batch["ref_logprobs"] = ref.call("ComputeLogProbs", Payload(actor_pb2.BatchRequest(
            temperature=r.temperature), policy.select(POLICY_TENSORS[:4]))).data.batch["ref_logprobs"]
    timing["timing_s/old_log_prob"] = time.perf_counter() - t
    policy.batch["advantages"] = advantages

    t = time.perf_counter()
    params = {k: to_value(v, k) for k, v in ppo_params(cfg).items()}
    update = actor.call("Update", Payload(actor_pb2.UpdateRequest(
        step=number, loss=actor_pb2.LossSpec(name="ppo", params=params)), policy))
    timing["timing_s/update_actor"] = time.perf_counter() - t

    t = time.perf_counter()
    actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=rollout.address,
                                                           transport=r.weight_transport, version=number))
    timing["timing_s/update_weights"] = time.perf_counter() - t

    lengths = mask.sum(-1)
    metrics = {"critic/score/mean": scored.scores.mean().item(),
               "critic/advantages/mean": masked_mean(advantages, mask).item(),
               "response_length/mean": lengths.float().mean().item(),
               "rollout/kl_to_actor": masked_mean((gen.batch["rollout_logprobs"] - policy.batch["actor_logprobs"]).abs(),
                                                  mask).item(),
               **{k: v for k, v in update.metrics.items()}, **timing}
    if "acc" in scored.columns:
        metrics["critic/acc/mean"] = float(sum(bool(x) for x in scored.columns["acc"]) / len(scored.scores))
    metrics["perf/tokens_per_s"] = lengths.sum().item() / max(1e-9, sum(timing.values()))
    return metrics


def validate(cfg: Config, data: PromptDataset, rollout, reward) -> dict[str, float]:
    """Greedy answers to every validation prompt, scored: val/score/mean and val/acc/mean."""
    batch = data.batch(list(range(len(data))), [f"val-{i}" for i in range(len(data))])
    sampling = rollout_pb2.SamplingParams(n=1, greedy=True, max_new_tokens=cfg.rollout.max_new_tokens)
    gen = rollout.call("Generate", Payload(rollout_pb2.GenerateRequest(sampling=sampling), batch)).data
    scored = reward.score(gen)
    out = {"val/score/mean": scored.scores.mean().item()}
    if "acc" in scored.columns:
        out["val/acc/mean"] = float(sum(bool(x) for x in scored.columns["acc"]) / len(scored.scores))
    return out


def save(run_dir: pathlib.Path, number: int, actor, sampler: Sampler, export_hf: bool) -> None:
    """Everything a resumed run needs: the actor's checkpoint, the data position, the step."""
    path = run_dir / "checkpoints" / f"step_{number}"
    actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=str(path), export_hf=export_hf))
    (path / "orchestrator.json").write_text(json.dumps({"step": number, "sampler": sampler.state_dict()}))
    (run_dir / "checkpoints" / "latest").write_text(path.name)  # written last: a half-saved step is not "latest"


def resume(cfg: Config, run_dir: pathlib.Path, actor, rollout, sampler: Sampler) -> int:
    """Restore the latest checkpoint into the services and the sampler; returns its step (0 if none)."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        log.info("no checkpoint in %s: starting from step 1", run_dir)
        return 0
    path = run_dir / "checkpoints" / latest.read_text().strip()
    state = json.loads((path / "orchestrator.json").read_text())
    actor.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=str(path)))
    sampler.load_state_dict(state["sampler"])
    actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=rollout.address,
                                                           transport=cfg.rollout.weight_transport,
                                                           version=state["step"]))
    log.info("resumed from %s (step %d)", path, state["step"])
    return state["step"]


def run(cfg: Config) -> pathlib.Path:
    """Train; returns the run folder (config.yaml, metrics.jsonl, checkpoints)."""
    run_dir, tokenizer, data, sampler = prepare_run(cfg)
    val = PromptDataset(cfg.data.val_files, tokenizer, cfg.data.max_prompt_length) if cfg.data.val_files else None
    torch.manual_seed(cfg.trainer.seed)
    services = Services()
    try:
        actor, rollout, reward, ref = start_services(cfg, services)
        first = resume(cfg, run_dir, actor, rollout, sampler) + 1 if cfg.trainer.resume else 1
        with open(run_dir / "metrics.jsonl", "a") as out, tqdm(range(first, cfg.trainer.total_steps + 1),
                                                              desc="grpo", unit="step") as bar:
            if val is not None and first == 1:
                out.write(json.dumps({"step": 0, **validate(cfg, val, rollout, reward)}) + "\n")
            for number in bar:
                indices, uids = sampler.next()
                metrics = step(cfg, number, data.batch(indices, uids), actor, rollout, reward, ref)
                last = number == cfg.trainer.total_steps
                if val is not None and (number % cfg.trainer.val_every == 0 or last):
                    metrics.update(validate(cfg, val, rollout, reward))
                out.write(json.dumps({"step": number, **metrics}) + "\n")
                out.flush()
                if number % cfg.trainer.save_every == 0 or last:
                    save(run_dir, number, actor, sampler, export_hf=last)
                bar.set_postfix(score=f"{metrics['critic/score/mean']:.3f}",
                                acc=f"{metrics.get('critic/acc/mean', float('nan')):.3f}")
    finally:
        services.stop()
    return run_dir
