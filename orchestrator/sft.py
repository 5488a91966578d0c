"""SFT through the actor service: teach the answers (extra_info.answer, as verl's GSM8K SFT reads them)
as assistant turns after the chat-rendered prompt, with masked cross-entropy on the answer tokens.

Used as the warm-up before RL: a randomly initialised model scores zero, and zero rewards teach nothing.
"""

import json
import logging
import pathlib

import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.v1 import actor_pb2
from orchestrator.config import Config, save_config
from orchestrator.data import PromptDataset, Sampler
from orchestrator.services import Services

log = logging.getLogger(__name__)


def sft_batch(data: PromptDataset, indices: list[int], tokenizer) -> DataProto:
    """Prompt (left padded) + answer and </s> (right padded) in verl's layout, response_mask on the answer."""
    prompts = [data.prompt_ids[i] for i in indices]
    answers = [tokenizer(str(data.rows[i]["extra_info"]["answer"]), add_special_tokens=False)["input_ids"]
               + [tokenizer.eos_token_id] for i in indices]
    P, T = max(map(len, prompts)), max(map(len, answers))
    pad = data.pad
    ids = torch.tensor([[pad] * (P - len(p)) + p + a + [pad] * (T - len(a)) for p, a in zip(prompts, answers)])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * (len(p) + len(a)) + [0] * (T - len(a))
                         for p, a in zip(prompts, answers)])
    response_mask = torch.tensor([[1.0] * len(a) + [0.0] * (T - len(a)) for a in answers])
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                      "responses": ids[:, P:], "response_mask": response_mask})


def run(cfg: Config) -> pathlib.Path:
    """Train with SFT; returns the run folder (config.yaml, metrics.jsonl, hf/ with the trained model)."""
    if not cfg.actor.model or not cfg.data.train_files:
        raise ValueError("set actor.model and data.train_files")
    run_dir = pathlib.Path(cfg.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor.model)
    data = PromptDataset(cfg.data.train_files, tokenizer, cfg.data.max_prompt_length)
    sampler = Sampler(len(data), cfg.data.train_batch_size, cfg.trainer.seed, cfg.data.shuffle)
    services = Services()
    a = cfg.actor
    try:
        actor = services.start("actor", a.address, [
            "actor", "--role", "actor", "--model", a.model, "--world-size", str(a.world_size), "--engine", a.engine,
            "--lr", str(a.lr), "--grad-clip", str(a.grad_clip), "--warmup-steps", str(a.warmup_steps),
            "--micro-batch-size", str(a.micro_batch_size), "--seed", str(cfg.trainer.seed)])
        with open(run_dir / "metrics.jsonl", "a") as out, tqdm(range(1, cfg.trainer.total_steps + 1),
                                                              desc="sft", unit="step") as bar:
            for number in bar:
                indices, _ = sampler.next()
                reply = actor.call("Update", Payload(actor_pb2.UpdateRequest(
                    step=number, loss=actor_pb2.LossSpec(name="sft")), sft_batch(data, indices, tokenizer)))
                metrics = dict(reply.metrics)
                out.write(json.dumps({"step": number, **metrics}) + "\n")
                out.flush()
                bar.set_postfix(loss=f"{metrics['actor/sft_loss']:.3f}")
        actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=str(run_dir / "checkpoint"), export_hf=True))
    finally:
        services.stop()
    return run_dir
