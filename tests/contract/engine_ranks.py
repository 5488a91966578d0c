"""One rank of an engine check, run as a subprocess per rank (torchrun-style env: RANK, WORLD_SIZE,
MASTER_PORT). Forward, one forward-backward + step on a fixed batch, then rank 0 writes the loss,
grad norm, log-probs and updated weights (from the full state dict, and as a weight push gathers
them) to OUT for the test to compare across engines.

    python tests/contract/engine_ranks.py ENGINE MODEL OUT [--mixed-precision] [--grad-ckpt] [--hsdp N]
        [--save CKPT_DIR] [--export HF_DIR] [--load CKPT_DIR] [--share] [--lora RANK] [--padding-free]

--share: micro-batches of 2 rows that share their prompt, run once (model.forward_response's share_prompts).
--padding-free: micro-batches of 2 rows, packed (services/actor/packing.py).
--router-losses: a mixture of experts' load-balancing (0.01) and z-loss (0.001) terms added to each
micro-batch's loss, as the actor role adds them (meshrl.algos.moe).
--sp N: sequence parallelism over groups of N ranks (services/actor/sequence.py): a group's ranks hold the
same rows (the batch is split over world / N groups) and each runs 1/N of every packed row's tokens.

--lora RANK: train a LoRA adapter of that rank on every linear layer of the blocks (alpha 16); the push is
then the adapter's (pushed.safetensors), and rank 0 also writes the merged push (merged.safetensors) and the
base model's log-probs (base_logprobs.safetensors, the adapter off) after the step. --export writes the
adapter folder next to the HF one (HF_DIR + "_adapter").

--load skips the update: it loads a checkpoint and writes the log-probs it gives.

--cancel-at K [--rows N] [--mini M]: instead, an SFT update (the actor role's, micro-batches of one row,
mini-batches of M rows, in order) on the first N rows, whose caller "goes away" at the K-th between-micro-batch
check (K 0: never); only rank 0 knows, as in the service. Writes the weights before and after and
what the stop reported.
"""

import hashlib
import itertools
import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from meshrl import cuda_ipc
from meshrl.algos.moe import RouterCapture, router_terms
from meshrl.config.actor import EngineConfig, OptimConfig
from meshrl.dataproto import DataProto
from meshrl.v1 import rollout_pb2
from services.actor import comm
from services.actor.engine import build_engine
from services.actor.handler import per_gpu_share, weight_buckets
from services.actor.head import response_logprobs
from services.actor.losses import parse_loss
from services.actor.model import forward_response, token_logprobs
from services.actor.roles import ActorRole

B, P, T = 4, 5, 6  # rows, prompt length, response length


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 100, (B, P + T), generator=g)
    ids[1, :P], ids[3, :P] = ids[0, :P], ids[2, :P]  # two prompts, each sampled twice
    mask = torch.ones(B, P + T, dtype=torch.long)
    mask[:2, :2] = 0  # left padding on one prompt
    response_mask = torch.ones(B, T)
    response_mask[1, 4:] = 0  # a short response
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": pos,
        "responses": ids[:, P:],
        "response_mask": response_mask,
    }


def main():  # noqa: PLR0915 - one rank's script, read top to bottom
    engine_name, model, out = sys.argv[1:4]
    flags = sys.argv[4:]
    if torch.cuda.is_available():  # as the service's ranks do (services/actor/launch.py): one GPU per rank
        torch.cuda.set_device(int(os.environ["RANK"]) % torch.cuda.device_count())
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sp = int(flags[flags.index("--sp") + 1]) if "--sp" in flags else 1
    cfg = EngineConfig(
        engine=engine_name,
        mixed_precision="--mixed-precision" in flags,
        gradient_checkpointing="--grad-ckpt" in flags,
        hsdp_replicate=int(flags[flags.index("--hsdp") + 1]) if "--hsdp" in flags else 1,
        micro_batch_size=1,
        lora_rank=int(flags[flags.index("--lora") + 1]) if "--lora" in flags else 0,
        padding_free="--padding-free" in flags,
        sequence_parallel=sp,
    )
    engine = build_engine(cfg, model, "causal", OptimConfig(lr=1e-3, grad_clip=0.0))
    full = batch()
    if "--cancel-at" in flags:
        return cancelled_update(engine, full, flags, out)
    group, groups = rank // sp, world // sp  # a sequence-parallel group's ranks hold the same rows
    rows = slice(group * B // groups, (group + 1) * B // groups)
    mine = {k: v[rows] for k, v in full.items()}
    share = "--share" in flags
    size = 2 if share or "--padding-free" in flags else 1
    micro = [{k: v[i : i + size] for k, v in mine.items()} for i in range(0, len(mine["input_ids"]), size)]
    total_tokens = full["response_mask"].sum().item()

    def logprobs(model, mb):
        if sp > 1:  # the roles' pass (the head by chunks, each rank of the group a share of the tokens)
            return response_logprobs(model, mb, share_prompts=share)[0]
        return token_logprobs(forward_response(model, mb, T, share_prompts=share), mb["responses"])

    whole = engine.shards.whole if engine.shards is not None else None  # the roles' view of a split pass
    capture = RouterCapture(engine.module, whole) if "--router-losses" in flags else None

    def nll(model, mb):
        if capture is not None:
            capture.clear()
        lp = logprobs(model, mb)
        loss = -(lp * mb["response_mask"]).sum() / total_tokens
        if capture is not None:
            loss = loss + router_terms(capture, 0.01, 0.001)[0]
        return loss, {}

    if "--load" in flags:
        engine.load(flags[flags.index("--load") + 1])
        write_logprobs(engine, micro, logprobs, out)
        return finish()
    before = torch.cat(engine.forward(micro, logprobs)).cpu()  # the batch stays on the CPU; results come back
    weights = [float(groups)] * len(micro)  # FSDP averages gradients over ranks, a group's N as one; undo it
    if capture is not None:
        with capture:
            engine.forward_backward(micro, nll, weights)
    else:
        engine.forward_backward(micro, nll, weights)
    loss = (-(before * mine["response_mask"]).sum() / total_tokens).reshape(1)
    dist.all_reduce(loss)
    loss /= sp  # a group's ranks hold the same rows
    stats = engine.step()
    write_logprobs(engine, micro, logprobs, out)
    sd = engine.full_state_dict()
    pushed = gather_as_pushed(engine, out)
    if engine.lora:
        merged = gather_as_pushed(engine, out, merged=True)
        with engine.adapter_disabled():
            write_logprobs(engine, micro, logprobs, out, "base_logprobs")
    if "--save" in flags:
        engine.save(flags[flags.index("--save") + 1])
    if "--export" in flags:
        hf = flags[flags.index("--export") + 1]
        engine.export_hf(hf, hf + "_adapter" if engine.lora else None)
    if rank == 0:
        save_file({k: v.cpu().clone() for k, v in sd.items()}, os.path.join(out, "weights.safetensors"))
        save_file(pushed, os.path.join(out, "pushed.safetensors"))
        if engine.lora:
            save_file(merged, os.path.join(out, "merged.safetensors"))
        with open(os.path.join(out, "stats.json"), "w") as f:
            json.dump({"loss": loss.item(), **stats}, f)
    finish()


def gather_as_pushed(engine, out, merged: bool = False) -> dict:
    """The weights as a push gathers them (services.actor.handler.weight_buckets; merged: merge_lora's):
    the smallest buckets (one block each), one bucket at a time. On several ranks, each bucket also goes
    through the per-GPU cuda_ipc sharing (services.actor.handler.per_gpu_share) with a CPU stand-in for the
    CUDA buffer; rank 0 writes, per bucket, the handles' GPU names in the order it got them and whether
    every rank's copy held rank 0's bytes (shared.json)."""
    buckets, gather = weight_buckets(engine, merged, "", 64)
    share = None
    if engine.world_size > 1:
        cuda_ipc.CudaBucket = CpuBucket  # per_gpu_share imports it when called
        share = per_gpu_share(buckets)
    pushed, shared = {}, []
    for b in buckets:
        names = [r.name for r in b.refs]
        tensors = gather(b)
        pushed.update({n: t.detach().cpu().clone() for n, t in zip(names, tensors)})
        if share is not None:
            handles = share(b, tensors)
            if engine.rank == 0:
                shared.append(
                    {
                        "gpus": [h.device_uuid for h in handles],
                        "same": all(h.handle == digest(tensors) for h in handles),
                    }
                )
    if engine.rank == 0 and share is not None and not merged:
        with open(os.path.join(out, "shared.json"), "w") as f:
            json.dump(shared, f)
    return pushed


def digest(tensors) -> bytes:
    return hashlib.sha256(
        b"".join(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() for t in tensors)
    ).digest()


class CpuBucket:
    """Stands in for meshrl.cuda_ipc.CudaBucket on CPU: its 'handle' names this rank and digests the bytes."""

    def __init__(self, size: int):
        self.size = size

    def fill(self, tensors, bucket) -> rollout_pb2.CudaIpcHandle:
        return rollout_pb2.CudaIpcHandle(
            device=dist.get_rank(), device_uuid=f"rank-{dist.get_rank()}", handle=digest(tensors)
        )


def cancelled_update(engine, full, flags, out):
    value = lambda flag, default: int(flags[flags.index(flag) + 1]) if flag in flags else default  # noqa: E731
    rank, world, rows = dist.get_rank(), dist.get_world_size(), value("--rows", B)
    mine = {k: v[rank * rows // world : (rank + 1) * rows // world] for k, v in full.items()}
    before = {k: v.detach().cpu().clone() for k, v in engine.full_state_dict().items()}
    stop_at = value("--cancel-at", 0)
    if rank == 0 and stop_at:
        checks = itertools.count(1)
        comm._alive = lambda: next(checks) < stop_at
    stats = {}
    try:
        ActorRole(engine).update(
            DataProto(mine),
            "sft",
            # in the batch's order: the first optimizer step is on the first rows, as --rows 2 makes it alone
            parse_loss("actor", "sft", {"mini_batch_size": value("--mini", 2), "shuffle": False}),
            rows,
            1,
        )
    except comm.Cancelled as e:
        stats = {**e.meta, "message": str(e)}
    stats["gradients"] = sum(p.grad is not None for p in engine.module.parameters())
    after = engine.full_state_dict()
    if rank == 0:
        save_file({k: v.contiguous() for k, v in before.items()}, os.path.join(out, "before.safetensors"))
        save_file({k: v.cpu().clone() for k, v in after.items()}, os.path.join(out, "weights.safetensors"))
        with open(os.path.join(out, "stats.json"), "w") as f:
            json.dump(stats, f)
    finish()


def finish():
    # Leave together, then skip interpreter teardown: gloo's worker threads can still hold work objects
    # there and abort the process ("terminate called without an active exception"), seen once in CI
    # after a DCP load. The results are already on disk.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def write_logprobs(engine, micro, logprobs, out, name="logprobs"):
    mine = torch.cat(engine.forward(micro, logprobs)).cpu()  # gathered over gloo, as the service does
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    if dist.get_rank() == 0:  # one copy of a sequence-parallel group's rows
        save_file(
            {"logprobs": torch.cat(gathered[:: engine.cfg.sequence_parallel])}, os.path.join(out, f"{name}.safetensors")
        )


if __name__ == "__main__":
    main()
