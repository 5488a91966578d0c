"""Helpers for the LoRA rollout tests: peft adapters of the tiny model, pushed as the actor would push them,
the log-probs peft itself gives (the reference every backend must match), an HF rollout to push to."""

import functools

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from meshrl import weights
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.v1 import rollout_pb2

ALL_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
TOLERANCE = 1e-4  # |peft - rollout| log-prob; the same model in float32 gives ~1e-6
ADAPTER_EFFECT = 1e-2  # an adapter of make_adapter's moves the log-probs by far more than this (~1)


@functools.cache
def base_model(model_dir):
    """The model without an adapter: the reference once full weights dropped it."""
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def prompts():
    return DataProto(non_tensor_batch={"prompt": [[{"role": "user", "content": q}] for q in ("3+4=", "12+7=", "0+9=")]})


def generate(client, **sampling):
    sampling = {"n": 2, "temperature": 1.0, "max_new_tokens": 8, "logprobs": True, "seed": 7, **sampling}
    request = rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(**sampling))
    return client.call("Generate", Payload(request, prompts()))


def next_version(client) -> int:
    return client.call("Describe").weight_version + 1


def make_adapter(model_dir, seed: int, rank: int = 8, targets=ALL_LINEAR, scale: float = 0.1):
    """(peft model, its adapter state dict, the LoraAdapter a push announces). lora_B starts at zero in peft
    (a no-op adapter); random values here make the adapter change what the model generates."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, scale)
    model.eval()
    lora = rollout_pb2.LoraAdapter(rank=rank, alpha=2.0 * rank, target_modules=sorted(targets))
    return model, get_peft_model_state_dict(model), lora


def push_adapter(client, named, lora, version, transport="shm", bucket_bytes=weights.DEFAULT_BUCKET_BYTES):
    return weights.push_state(client, named, version, transport, bucket_bytes=bucket_bytes, lora=lora)


@torch.no_grad()
def reference_logprobs(model, data) -> torch.Tensor:
    """Log-probs (temperature 1) of a rollout's responses under `model`, 0 past each response: (B, T)."""
    responses = data.batch["responses"]
    T = responses.shape[1]
    logits = model(
        input_ids=data.batch["input_ids"],
        attention_mask=data.batch["attention_mask"],
        position_ids=data.batch["position_ids"],
    ).logits[:, -T - 1 : -1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    return lp * data.batch["response_mask"]


def gap(model, data) -> float:
    """Largest |reference - rollout| log-prob over the response tokens."""
    mask = data.batch["response_mask"]
    return (reference_logprobs(model, data) - data.batch["rollout_logprobs"] * mask).abs().max().item()
