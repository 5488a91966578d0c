"""SFT through the actor service: teach the answers (extra_info.answer, as verl's GSM8K SFT reads them)
as assistant turns after the chat-rendered prompt, with masked cross-entropy on the answer tokens.

Used as the warm-up before RL: a randomly initialised model scores zero, and zero rewards teach nothing.
"""

import json
import logging
import pathlib

import torch
from tqdm import tqdm
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.v1 import actor_pb2
from orchestrator.config import Config
from orchestrator.data import PromptDataset, prepare_run
from orchestrator.services import Services, start_actor

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
    run_dir, tokenizer, data, sampler = prepare_run(cfg)
    services = Services()
    try:
        actor = start_actor(cfg, services)
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
