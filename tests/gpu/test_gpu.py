"""The GPU lane (scripts/test_gpu.sh; skipped without CUDA): weights handed over on the device.

- cuda_ipc across processes: this process shares CUDA buckets with a rollout
  service in another (CUDA IPC works only across processes), in one bucket and
  in 1 MiB buckets (the tiny model is ~11 MiB), and the rollout's log-probs then
  equal a local forward with those weights;
- the actor service on NCCL ranks (one per GPU) gathers on the device and pushes
  over cuda_ipc, with log-prob parity (on several GPUs each rank shares its own
  copy and the rollout reads the one on its GPU);
- a GRPO run on the GPU with the HF rollout and cuda_ipc, in fp32 and in bf16 with the actor's passes
  packed (flash-attention's varlen kernel);
- the packed passes through the varlen kernel give the padded passes' log-probs (bf16).
"""

import functools
import json
import tempfile

import pytest
import torch
from safetensors.torch import load_file

from meshrl import weights
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.rpc import Client
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.config import load_config
from orchestrator.lifecycle.services import launch
from orchestrator.main import run
from services.actor.model import forward_response, token_logprobs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
TOLERANCE = 1e-3  # fp32 on one GPU; a 5% change of one matrix moves log-probs by ~1e-2
BASE = ["input_ids", "attention_mask", "position_ids", "responses"]


@pytest.fixture(scope="module")
def rollout(tiny_lm):
    proc, address = launch(["rollout", "--model", str(tiny_lm), "--backend", "hf", "--max-model-len", "128"])
    yield Client(address, ROLLOUT, timeout=300)
    proc.terminate()
    assert proc.wait(120) == 0


def generate(rollout, seed=5):
    prompts = DataProto(
        non_tensor_batch={
            "prompt": [[{"role": "user", "content": f"{a}+{b}="}] for a, b in [(3, 4), (12, 7), (0, 9), (5, 5)]]
        }
    )
    sampling = rollout_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=16, logprobs=True, seed=seed)
    return rollout.call("Generate", Payload(rollout_pb2.GenerateRequest(sampling=sampling), prompts))


def worst_gap(logprobs: torch.Tensor, gen: DataProto) -> float:
    mask = gen.batch["response_mask"]
    return ((logprobs.cpu() - gen.batch["rollout_logprobs"]).abs() * mask).max().item()


@torch.no_grad()
def local_logprobs(model_dir, named: dict, gen: DataProto) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).cuda().eval()
    model.load_state_dict(named, strict=False)
    micro = {k: gen.batch[k].cuda() for k in BASE}
    return token_logprobs(forward_response(model, micro), micro["responses"])


@pytest.mark.parametrize("bucket", [0, 1 << 20])
def test_cuda_ipc_push_from_another_process_gives_parity(rollout, tiny_lm, bucket):
    version = rollout.call("Describe").weight_version + 1
    named = {k: (v * (1.0 + 0.01 * version)).cuda() for k, v in load_file(tiny_lm / "model.safetensors").items()}
    stats = weights.push_state(rollout, named, version, "cuda_ipc", bucket_bytes=bucket or weights.DEFAULT_BUCKET_BYTES)
    if bucket:
        assert stats["buckets"] >= 6  # embeddings, 4 blocks, head
    else:
        assert stats["buckets"] == 1
    gen = generate(rollout)
    assert gen.msg.weight_version == version
    gap = worst_gap(local_logprobs(tiny_lm, named, gen.data), gen.data)
    print(f"cuda_ipc push, bucket {bucket or 'whole'}: max |diff| {gap:.2e}")
    assert gap < TOLERANCE


def test_the_actor_on_nccl_ranks_pushes_over_cuda_ipc(rollout, tiny_lm):
    world = torch.cuda.device_count()
    proc, address = launch(
        [
            "actor",
            "--role",
            "actor",
            "--model",
            str(tiny_lm),
            "--world-size",
            "auto",
            "--lr",
            "1e-3",
            "--checkpoint-root",
            tempfile.gettempdir(),
        ]
    )
    try:
        actor = Client(address, ACTOR, timeout=300)
        assert actor.call("Describe").world_size == world
        gen = generate(rollout).data
        data = gen.select([*BASE, "response_mask"])
        actor.call("Update", Payload(actor_pb2.UpdateRequest(step=1, loss=actor_pb2.LossSpec(name="sft")), data))
        version = rollout.call("Describe").weight_version + 1
        for bucket in (0, 1 << 20):
            pushed = actor.call(
                "PushWeights",
                actor_pb2.PushWeightsRequest(
                    rollout_address=rollout.address, transport="cuda_ipc", version=version, bucket_bytes=bucket
                ),
            )
            assert pushed.version == version
            after = generate(rollout).data
            lp = actor.call(
                "ComputeLogProbs", Payload(actor_pb2.BatchRequest(temperature=1.0), after.select(BASE))
            ).data.batch["actor_logprobs"]
            gap = worst_gap(lp, after)
            print(
                f"actor ({world} NCCL ranks) -> rollout over cuda_ipc, bucket {bucket or 'whole'}: max |diff| {gap:.2e}"
            )
            assert gap < TOLERANCE
            version += 1
    finally:
        proc.terminate()
        assert proc.wait(120) == 0


@pytest.mark.parametrize(
    "precision, kl_bound",
    [
        (["actor.padding_free=false"], 1e-3),
        # bf16 on both sides, the actor's passes packed (the varlen kernel): the two sides' kernels differ,
        # so their log-probs agree to bf16's precision, not fp32's
        (["actor.mixed_precision=true", "actor.padding_free=true", "rollout.dtype=bfloat16"], 2e-2),
    ],
    ids=["fp32-padded", "bf16-packed"],
)
def test_grpo_on_the_gpu(tiny_lm, arithmetic_data, tmp_path, precision, kl_bound):
    cfg = load_config(
        None,
        [
            f"actor.model={tiny_lm}",
            f"data.train_files={arithmetic_data['train']}",
            f"trainer.run_dir={tmp_path}",
            "trainer.total_steps=2",
            "data.train_batch_size=4",
            "rollout.n=2",
            "rollout.backend=hf",
            "rollout.weight_transport=cuda_ipc",
            "rollout.weight_bucket_mb=1",
            "actor.world_size=auto",
            "reward.workers=1",
            *precision,
        ],
    )
    lines = [json.loads(line) for line in (run("grpo", cfg) / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    print(f"kl_to_actor by step: {[m['rollout/kl_to_actor'] for m in lines]}")
    assert all(m["rollout/kl_to_actor"] < kl_bound for m in lines)  # the rollout runs what the actor pushed


def test_grpo_of_a_mixture_of_experts_on_the_gpu_with_routing_replay(arithmetic_data, tmp_path):
    """A tiny Qwen3-MoE through GRPO on the GPU in bf16 (mixed precision, packed passes, a bf16 hf rollout):
    its per-expert tensors pushed over cuda_ipc, the rollout's experts returned and replayed (R3) in the
    actor's passes; the rollout stays within bf16's parity of the actor."""
    from meshrl.tiny.models import TinyModelConfig, make_model

    model = make_model(tmp_path / "moe", TinyModelConfig(family="qwen3_moe", num_experts=8))
    cfg = load_config(
        None,
        [
            f"actor.model={model}",
            f"data.train_files={arithmetic_data['train']}",
            f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.total_steps=2",
            "data.train_batch_size=4",
            "rollout.n=2",
            "rollout.backend=hf",
            "rollout.dtype=bfloat16",
            "rollout.weight_transport=cuda_ipc",
            "actor.mixed_precision=true",
            "actor.mini_batch_size=4",
            "actor.router_replay=r3",
            "actor.world_size=auto",
            "reward.workers=1",
        ],
    )
    lines = [json.loads(line) for line in (run("grpo", cfg) / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    print({k: [m[k] for m in lines] for k in ("rollout/kl_to_actor", "actor/moe/routing_agreement")})
    assert all(m["rollout/kl_to_actor"] < 2e-2 and 0.5 < m["actor/moe/routing_agreement"] <= 1 for m in lines)


def test_padding_free_passes_run_the_varlen_kernel_with_the_padded_results(tiny_lm):
    """actor.padding_free on CUDA in bf16: attention through flash-attention's varlen kernel (plain packed
    rows and rows sharing prompts), log-probs as the padded pass's to bf16's precision."""
    from meshrl.layout import rollout_tensors
    from meshrl.models import load_model
    from services.actor import packing

    padded, flat = (load_model(str(tiny_lm), "causal").to("cuda", torch.bfloat16) for _ in range(2))
    packing.enable(flat)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 30, (n,), generator=g).tolist() for n in (6, 9, 4)]
    rows = [prompts[i] for i in (0, 0, 1, 1, 1, 2, 2, 2)]
    responses = [torch.randint(3, 30, (n,), generator=g).tolist() for n in (4, 2, 5, 1, 7, 3, 6, 2)]
    mb = {k: t.cuda() for k, t in rollout_tensors(rows, responses, 0).items()}
    calls = []
    kernel = packing.varlen_attn

    @functools.wraps(kernel)  # the same signature: packing reads from it which arguments this torch takes
    def counted(*a, **kw):
        calls.append(1)
        return kernel(*a, **kw)

    packing.varlen_attn = counted
    try:
        for share in (False, True):
            a, b = (
                token_logprobs(forward_response(m, mb, share_prompts=share), mb["responses"]) * mb["response_mask"]
                for m in (padded, flat)
            )
            assert (a - b).abs().max() < 0.05, (share, (a - b).abs().max())
    finally:
        packing.varlen_attn = kernel
    assert calls and not packing.OFF


def test_routing_replay_on_the_gpu_in_bf16(tmp_path):
    """Routing replay (meshrl/algos/router_replay.py) on CUDA in bf16, a tiny Qwen3-MoE: the experts recorded
    on the GPU replay in the padded pass and in the packed passes through the varlen kernel (rows sharing
    prompts too), all agreeing with the padded pass to bf16's precision; replaying a model's own choices
    changes nothing; after the routers move, replay still routes as recorded (agreement < 1 afresh)."""
    from meshrl.algos.moe import routers
    from meshrl.algos.router_replay import ROUTED, agreement, compared, replay_of
    from meshrl.layout import rollout_tensors
    from meshrl.models import load_model
    from meshrl.tiny.models import TinyModelConfig, make_model
    from services.actor import packing
    from services.actor.model import record_routing

    cfg = TinyModelConfig(family="qwen3_moe", num_experts=8, hidden_size=128, num_layers=2, num_heads=2)
    folder = make_model(tmp_path / "moe", cfg)
    padded, flat = (load_model(str(folder), "causal").to("cuda", torch.bfloat16) for _ in range(2))
    packing.enable(flat)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 30, (n,), generator=g).tolist() for n in (6, 9, 4)]
    rows = [prompts[i] for i in (0, 0, 1, 1, 1, 2, 2, 2)]
    responses = [torch.randint(3, 30, (n,), generator=g).tolist() for n in (4, 2, 5, 1, 7, 3, 6, 2)]
    mb = {k: t.cuda() for k, t in rollout_tensors(rows, responses, 0).items()}
    routed = record_routing(padded, mb).cuda()
    own = token_logprobs(forward_response(padded, mb), mb["responses"]) * mb["response_mask"]
    again = token_logprobs(forward_response(padded, {**mb, ROUTED: routed}), mb["responses"]) * mb["response_mask"]
    assert torch.equal(own, again)
    for model in (padded, flat):
        for r in routers(model):
            r.weight.data += torch.randn(r.weight.shape, generator=torch.Generator().manual_seed(1)).to(r.weight)
    moved = record_routing(padded, mb)
    assert agreement(moved, routed.cpu(), compared(mb["attention_mask"].cpu())) < 1
    first = None
    for model, share in ((padded, False), (padded, True), (flat, False), (flat, True)):
        lp = token_logprobs(forward_response(model, {**mb, ROUTED: routed}, share_prompts=share), mb["responses"])
        lp = lp * mb["response_mask"]
        first = lp if first is None else first
        assert (lp - first).abs().max() < 0.05, (share, (lp - first).abs().max())
        assert replay_of(model).agreement()["actor/moe/routing_agreement"] < 1
    assert not packing.OFF
