"""The rollout service over a real gRPC server, with the HF backend (vLLM's own tests are in e2e)."""

import grpc
import pytest
import torch
from calls import ROLLOUT as SERVICE
from calls import chats, current_weights, expect, generate, wait_until

from meshrl import weights
from meshrl.codec import Payload
from meshrl.config.rollout import RolloutConfig
from meshrl.dataproto import DataProto
from meshrl.delta import whole
from meshrl.errors import ServiceError
from meshrl.rpc import Client, Server
from meshrl.shm import SEAL_BYTES
from meshrl.v1 import rollout_pb2
from services.rollout.servicer import RolloutServicer


def test_generate_gives_verls_layout(rollout):
    reply = generate(rollout, chats("3+4=", "12+7="), n=3, seed=1)
    d = reply.data
    assert len(d) == 6 and reply.msg.weight_version == d.meta_info["weight_version"]
    B, P = d.batch["prompts"].shape
    T = d.batch["responses"].shape[1]
    assert d.batch["input_ids"].shape == (6, P + T) and T <= 8
    assert torch.equal(d.batch["input_ids"][:, P:], d.batch["responses"])
    assert torch.equal(d.batch["attention_mask"][:, P:].float(), d.batch["response_mask"])
    assert torch.equal(d.batch["position_ids"], (d.batch["attention_mask"].cumsum(1) - 1).clamp(min=0))
    assert list(d.non_tensor_batch["uid"]) == ["u0"] * 3 + ["u1"] * 3  # each prompt's samples adjacent
    lp = d.batch["rollout_logprobs"]
    assert (lp <= 0).all() and (lp * (1 - d.batch["response_mask"]) == 0).all()
    assert set(d.non_tensor_batch["finish_reason"]) <= {"stop", "length"}
    assert all(isinstance(t, str) for t in d.non_tensor_batch["response_text"])


def test_same_seed_same_tokens_and_token_prompts(rollout):
    a = generate(rollout, chats("1+1="), seed=7).data.batch["responses"]
    b = generate(rollout, chats("1+1="), seed=7).data.batch["responses"]
    assert torch.equal(a, b)
    ids = torch.tensor([[0, 0, 101, 5, 76, 5, 84, 99, 102]])
    tokens = DataProto({"input_ids": ids, "attention_mask": (ids != 0).long()})
    g1 = generate(rollout, tokens, temperature=0.0).data
    g2 = generate(rollout, tokens, greedy=True).data
    assert torch.equal(g1.batch["responses"], g2.batch["responses"])
    assert g1.batch["prompts"].tolist() == [[101, 5, 76, 5, 84, 99, 102]]


def test_a_prompts_samples_do_not_depend_on_the_rest_of_its_call(rollout):
    """Prompt i of a call samples with seed + i from streams of its own: alone, in a call of four, or in the
    parts a rollout fleet cuts that call into (part [a, b) with seed + a), it samples the same tokens."""
    questions = ["3+4=", "12+37=", "5+5=", "41+8="]  # of different lengths: each call pads them differently

    def samples(qs, seed):
        d = generate(rollout, chats(*qs), n=3, seed=seed, max_new_tokens=12).data
        kept = d.batch["response_mask"].bool()
        return [d.batch["responses"][r][kept[r]].tolist() for r in range(len(d))]

    whole = samples(questions, 5)
    assert samples(questions[:2], 5) + samples(questions[2:], 7) == whole  # a fleet of two
    assert [s for i, q in enumerate(questions) for s in samples([q], 5 + i)] == whole
    assert samples(questions, 6) != whole


def test_a_prompt_sampled_n_times_runs_once_with_the_same_results(rollout, tiny_lm):
    """The hf backend prefills each distinct prompt once for its n samples: greedy samples equal the n=1
    answer, and the log-probs it reports are a full HF forward's over prompt + response."""
    from transformers import AutoModelForCausalLM

    questions = chats("3+4=", "12+7=", "5+5=")
    one = generate(rollout, questions, greedy=True).data.batch["responses"]
    three = generate(rollout, questions, greedy=True, n=3).data.batch["responses"]
    assert torch.equal(three, one.repeat_interleave(3, 0)[:, : three.shape[1]])
    d = generate(rollout, questions, n=4, seed=3).data
    T = d.batch["responses"].shape[1]
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    with torch.no_grad():
        logits = model(
            input_ids=d.batch["input_ids"],
            attention_mask=d.batch["attention_mask"],
            position_ids=d.batch["position_ids"],
        ).logits[:, -T - 1 : -1]
    local = torch.log_softmax(logits, -1).gather(-1, d.batch["responses"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(local * d.batch["response_mask"], d.batch["rollout_logprobs"], atol=1e-4)


@pytest.mark.parametrize(
    "data,sampling,match",
    [
        (chats("1+1="), {"n": 0}, "sampling.n must be >= 1"),
        (chats("1+1="), {"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        (chats("1+1="), {"top_p": 1.5}, "top_p must be in"),
        (chats("1+1="), {"temperature": -1.0}, "temperature must be a finite number >= 0"),
        (chats("1+1="), {"stop": ["x" * 400_000]}, "characters at most"),  # 48 s of the hf rollout's search
        (chats("1+1=" * 30), {}, "row 0: prompt of"),
        (
            DataProto(
                {
                    "input_ids": torch.zeros(2, 3, dtype=torch.long),
                    "attention_mask": torch.tensor([[1, 1, 1], [0, 0, 0]]),
                }
            ),
            {},
            "row 1: empty prompt",
        ),
        (DataProto(non_tensor_batch={"text": ["hi"]}), {}, "needs input_ids + attention_mask"),
        (DataProto(non_tensor_batch={"prompt": [5]}), {}, "row 0: a prompt is a string or a non-empty list"),
        (DataProto(non_tensor_batch={"prompt": [[{"content": "hi"}]]}), {}, "row 0: message 0 must be a mapping"),
    ],
)
def test_bad_generate_requests(rollout, data, sampling, match):
    expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: generate(rollout, data, **sampling), match)


def test_a_string_prompt_is_one_user_message(rollout):
    """OpenRLHF/TRL data hold prompts as text: the model gets that text as a user turn, not its characters
    as messages (a chat template iterates over whatever it is given)."""
    as_text = generate(rollout, DataProto(non_tensor_batch={"prompt": ["3+4="]}), temperature=0.0).data
    as_chat = generate(rollout, chats("3+4="), temperature=0.0).data
    assert torch.equal(as_text.batch["prompts"], as_chat.batch["prompts"])


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_push_new_weights(rollout, tiny_lm, transport):
    probe = chats("5+5=")
    before = generate(rollout, probe, temperature=0.0)
    version = before.msg.weight_version + 1
    weights.push_state(rollout, current_weights(tiny_lm, 1.0 + 0.05 * version), version, transport)
    after = generate(rollout, probe, temperature=0.0)
    assert after.msg.weight_version == version == rollout.call("Describe").weight_version
    assert not torch.equal(after.data.batch["rollout_logprobs"], before.data.batch["rollout_logprobs"])


def test_a_rollback_takes_an_older_version_and_nothing_else_does(rollout, tiny_lm):
    """A run back at its checkpoint pushes the checkpoint's (older) version into a rollout given by address,
    which kept the newer weights: only a push that says so (rollback) is taken; the engine then runs it."""
    probe = chats("4+4=")
    v = rollout.call("Describe").weight_version
    weights.push_state(rollout, current_weights(tiny_lm, 1.5), v + 2, "stream")
    with pytest.raises(ServiceError, match="is not newer than the version in use"):
        weights.push_state(rollout, current_weights(tiny_lm), v + 1, "stream")
    weights.push_state(rollout, current_weights(tiny_lm), v + 1, "stream", rollback=True)
    after = generate(rollout, probe, temperature=0.0)
    assert after.msg.weight_version == v + 1 == rollout.call("Describe").weight_version
    weights.push_state(rollout, current_weights(tiny_lm, 1.5), v + 2, "stream")  # and on from there


def test_bad_weight_updates_keep_the_old_weights(rollout, tiny_lm):
    probe = chats("2+2=")
    before = generate(rollout, probe, temperature=0.0)
    v = before.msg.weight_version
    good = current_weights(tiny_lm, 3.0)
    refs, total = weights.layout(good)
    bad = grpc.StatusCode.INVALID_ARGUMENT
    old = grpc.StatusCode.FAILED_PRECONDITION

    def begin(version, transport="shm", size=total):
        return rollout.call(
            "BeginWeightUpdate",
            rollout_pb2.BeginWeightUpdateRequest(version=version, transport=transport, total_bytes=size),
        )

    expect(bad, lambda: begin(v + 1, size=512 << 20), "total_bytes must be in 1..")  # no /dev/shm on a word
    expect(
        bad,
        lambda: rollout.call(
            "BeginWeightUpdate",
            rollout_pb2.BeginWeightUpdateRequest(
                version=v + 1, transport="shm", total_bytes=total, bucket_bytes=total + 1
            ),
        ),
        "is more than total_bytes",
    )

    def send(*buckets):
        return rollout.call_stream("SendWeights", buckets)

    def finish(version):
        return rollout.call("FinishWeightUpdate", rollout_pb2.FinishWeightUpdateRequest(version=version))

    expect(old, lambda: begin(v), "is not newer than the version in use")
    expect(old, lambda: send(rollout_pb2.WeightBucket(version=v + 1, refs=refs)), "no weight update in progress")
    begin(v + 1)
    renamed = [rollout_pb2.TensorRef(name="model.nope", dtype=refs[0].dtype, shape=refs[0].shape, offset=0)]
    expect(bad, lambda: send(rollout_pb2.WeightBucket(version=v + 1, refs=renamed)), "'model.nope' is not a parameter")
    begin(v + 1)
    reshaped = [rollout_pb2.TensorRef(name=refs[0].name, dtype=refs[0].dtype, shape=[3, 3], offset=0)]
    expect(bad, lambda: send(rollout_pb2.WeightBucket(version=v + 1, refs=reshaped)), "has shape [3, 3]")
    begin(v + 1)
    send(rollout_pb2.WeightBucket(version=v + 1, refs=refs[:-1]))
    expect(old, lambda: generate(rollout, probe), "weight update")  # no generation while an update is open
    expect(bad, lambda: finish(v + 1), "update incomplete: 1 parameter(s) missing")
    begin(v + 1, "stream")
    send(rollout_pb2.WeightBucket(version=v + 1, refs=refs))
    expect(bad, lambda: finish(v + 1), "update incomplete: 0 of")
    begin(v + 1)
    handle = rollout_pb2.CudaIpcHandle(device=0, handle=b"h", device_uuid="GPU-x")
    expect(
        bad,
        lambda: send(rollout_pb2.WeightBucket(version=v + 1, refs=refs, cuda_ipc=handle)),
        "CUDA IPC handle came for the shm transport",
    )
    begin(v + 1)
    expect(
        bad,
        lambda: send(rollout_pb2.WeightBucket(version=v + 1, refs=refs, cuda_ipc_copies=[handle])),
        "cuda_ipc_copies without WeightBucket.cuda_ipc",
    )
    expect(bad, lambda: begin(v + 1, "carrier-pigeon"), "transport must be one of")
    expect(bad, lambda: begin(2**63 - 1), "BeginWeightUpdateRequest.version must be in 1..")  # used to pin it
    after = generate(rollout, probe, temperature=0.0)
    assert after.msg.weight_version == v
    assert torch.equal(after.data.batch["rollout_logprobs"], before.data.batch["rollout_logprobs"])


def test_a_bucketed_push_loads_what_one_bucket_loads(rollout, tiny_lm):
    probe = chats("6+7=", "9+9=")
    v = rollout.call("Describe").weight_version
    named = current_weights(tiny_lm, 1.1)
    weights.push_state(rollout, named, v + 1, "shm")
    whole = generate(rollout, probe, temperature=0.0).data.batch["rollout_logprobs"]
    for i, transport in enumerate(("shm", "stream")):
        weights.push_state(rollout, current_weights(tiny_lm, 0.8), v + 2 + 2 * i, "shm")
        stats = weights.push_state(rollout, named, v + 3 + 2 * i, transport, bucket_bytes=1 << 20)
        assert stats["buckets"] >= 6  # embeddings, 4 blocks, head: each over or near 1 MiB
        got = generate(rollout, probe, temperature=0.0)
        assert got.msg.weight_version == v + 3 + 2 * i
        assert torch.equal(got.data.batch["rollout_logprobs"], whole), transport


def test_an_abandoned_bucketed_update_is_refused_until_a_complete_one(rollout, tiny_lm):
    probe = chats("1+8=")
    v = rollout.call("Describe").weight_version
    named = current_weights(tiny_lm, 0.9)
    buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], 1 << 20)
    begun = rollout.call(
        "BeginWeightUpdate",
        rollout_pb2.BeginWeightUpdateRequest(
            version=v + 1,
            transport="stream",
            total_bytes=sum(b.size for b in buckets),
            bucket_bytes=max(b.size for b in buckets),
        ),
    )
    assert begun.in_progress
    first = buckets[0]
    payload = whole(first.refs, first.size, [named[r.name] for r in first.refs])
    rollout.call_stream("SendWeights", weights._stream(v + 1, payload))
    second = buckets[1]
    short = iter([rollout_pb2.WeightBucket(version=v + 1, refs=second.refs)])  # refs without their bytes
    expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: rollout.call_stream("SendWeights", short), "update incomplete")
    info = rollout.call("Describe")
    assert info.details["torn"] == "true" and info.details["update_in_progress"] == "false"
    assert info.weight_version == v
    expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: generate(rollout, probe), "abandoned weight update")
    again = max(v, 1)  # a torn engine takes its own version again, as the sender that broke off resends it
    weights.push_state(rollout, named, again, "stream", bucket_bytes=1 << 20)
    assert rollout.call("Describe").details["torn"] == "false"
    assert generate(rollout, probe).msg.weight_version == again


def test_the_staging_segment_is_one_bucket_not_the_model(tiny_lm):
    servicer = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=64))
    server = Server([servicer]).start()
    try:
        with Client(server.address, SERVICE, timeout=120) as client:
            named = current_weights(tiny_lm, 1.2)
            buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], 1 << 20)
            weights.push_state(client, named, 1, "shm", bucket_bytes=1 << 20)
            assert servicer.receiver.segment.size == max(b.size for b in buckets) + SEAL_BYTES
            assert servicer.receiver.segment.size < sum(b.size for b in buckets) / 3
    finally:
        server.stop(0)
        servicer.close()


def test_sleep_and_wake(rollout, tiny_lm):
    """A colocated run's order: asleep while the actor trains, its weights woken alone to take the new ones
    (refused before), then the rest to generate with them."""
    probe = chats("1+2=")
    before = generate(rollout, probe, temperature=0.0)
    asleep = rollout.call("Sleep", rollout_pb2.SleepRequest(level=1))
    assert asleep.sleeping and list(asleep.asleep) == ["kv_cache", "weights"]
    assert rollout.call("Describe").details["sleeping"] == "true"
    expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: generate(rollout, probe), "asleep")
    version = before.msg.weight_version + 1
    expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: weights.push_state(rollout, current_weights(tiny_lm, 1.3), version, "shm"),
        "WakeUp",
    )
    half = rollout.call("WakeUp", rollout_pb2.SleepRequest(tags=["weights"]))
    assert half.sleeping and list(half.asleep) == ["kv_cache"]
    weights.push_state(rollout, current_weights(tiny_lm, 1.3), version, "shm")
    expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: generate(rollout, probe), "kv_cache")
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: rollout.call("WakeUp", rollout_pb2.SleepRequest(tags=["optimizer"])),
        "optimizer",
    )
    expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: rollout.call("Sleep", rollout_pb2.SleepRequest(level=3)), "level")
    assert not rollout.call("WakeUp", rollout_pb2.SleepRequest()).sleeping
    after = generate(rollout, probe, temperature=0.0)
    assert after.msg.weight_version == version
    assert not torch.equal(after.data.batch["rollout_logprobs"], before.data.batch["rollout_logprobs"])
    weights.push_state(rollout, current_weights(tiny_lm), version + 1, "shm")  # as the other tests expect


def test_cuda_ipc_is_refused_without_a_gpu(rollout):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    v = rollout.call("Describe").weight_version + 1
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: rollout.call(
            "BeginWeightUpdate", rollout_pb2.BeginWeightUpdateRequest(version=v, transport="cuda_ipc", total_bytes=64)
        ),
        "cuda_ipc needs a GPU",
    )


def test_a_cancelled_generate_stops_and_frees_the_engine(rollout):
    """8,000 samples of 40 tokens (a minute of work here) asked with a 1 s deadline: generation stops
    within a token of the deadline and a small request right behind it is served at once."""
    import time

    start = time.monotonic()
    with pytest.raises(ServiceError) as e:
        rollout.call(
            "Generate",
            Payload(
                rollout_pb2.GenerateRequest(
                    sampling=rollout_pb2.SamplingParams(n=2000, temperature=1.0, max_new_tokens=40)
                ),
                chats("1+1=", "2+2=", "3+3=", "4+4="),
            ),
            timeout=1,
        )
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(generate(rollout, chats("5+5=")).data) == 1
    assert time.monotonic() - start < 15


def test_sigterm_stops_a_busy_rollout_within_seconds(tiny_lm):
    """In-flight calls get the server's grace (5 s), then are cancelled: a minute-long Generate stops at
    the next token and the process exits cleanly."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "serve",
            "rollout",
            "--backend",
            "hf",
            "--model",
            str(tiny_lm),
            "--max-model-len",
            "64",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert "listening on" in line, line
    client, outcome = Client(line.split()[-1], SERVICE, timeout=120, retries=0), {}

    def busy():
        try:
            client.call(
                "Generate",
                Payload(
                    rollout_pb2.GenerateRequest(
                        sampling=rollout_pb2.SamplingParams(n=2000, temperature=1.0, max_new_tokens=40)
                    ),
                    chats("1+1=", "2+2=", "3+3=", "4+4="),
                ),
            )
        except ServiceError as e:
            outcome["code"] = e.code

    t = threading.Thread(target=busy)
    t.start()
    time.sleep(2)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert time.monotonic() - start < 12
    t.join(10)
    assert outcome.get("code") in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)


@pytest.mark.parametrize("on_update", ["wait", "interrupt"])
def test_a_push_meets_a_generation_in_flight(tiny_lm, on_update):
    """A push sent while a long Generate runs. wait: the Generate finishes on the old weights, then the
    push loads (and a Generate sent meanwhile is refused). interrupt: the Generate ends ABORTED, saying
    to send it again, and the push loads at once. Either way the next Generate has the new weights."""
    import threading
    import time

    servicer = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=64, on_update=on_update))
    server = Server([servicer]).start()
    client, out = Client(server.address, SERVICE, timeout=120), {}

    def long():
        try:
            out["long"] = generate(
                client, chats("1+1=", "2+2="), n=100 if on_update == "wait" else 2000, max_new_tokens=40
            )
        except ServiceError as e:
            out["long"] = e

    def push():
        weights.push_state(client, current_weights(tiny_lm, 1.1), 1, "shm")
        out["push_end"], out["in_flight_at_push_end"] = time.monotonic(), len(servicer.calls)

    try:
        first = threading.Thread(target=long)
        first.start()
        wait_until(lambda: servicer.calls)
        second = threading.Thread(target=push)
        second.start()
        if on_update == "wait":
            wait_until(lambda: servicer.draining)
            expect(
                grpc.StatusCode.FAILED_PRECONDITION,
                lambda: generate(client, chats("3+3=")),
                "waiting for the generations in flight",
            )
        first.join(120)
        second.join(120)
        if on_update == "wait":
            assert out["long"].msg.weight_version == 0 and len(out["long"].data) == 200
            # the server's order, not the client threads' (which wake in either order on a busy core)
            assert out["in_flight_at_push_end"] == 0
        else:
            assert isinstance(out["long"], ServiceError), "a minute of generation was not interrupted"
            assert out["long"].code == grpc.StatusCode.ABORTED and "send it again" in out["long"].details
        assert "push_end" in out and not servicer.calls
        assert generate(client, chats("3+3=")).msg.weight_version == 1
    finally:
        server.stop(0)
        servicer.close()


def test_a_stop_string_ends_the_response_and_stays_in_it(rollout, tiny_lm):
    """Each sample stops at the first stop string it completes, which stays in its tokens and its text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm)
    d = generate(rollout, chats("1+2=", "3+4="), n=40, max_new_tokens=12, seed=4, stop=["5", "ab"]).data
    stopped = 0
    for i in range(len(d)):
        length = int(d.batch["response_mask"][i].sum())
        text = tok.decode(d.batch["responses"][i, :length].tolist(), skip_special_tokens=True)
        assert text == d.non_tensor_batch["response_text"][i]
        cut = min((text.find(s) + len(s) for s in ("5", "ab") if s in text), default=None)
        if cut is not None:  # the first stop string completed is where it ends
            assert cut == len(text) and d.non_tensor_batch["finish_reason"][i] == "stop"
            stopped += 1
    assert stopped > 0
