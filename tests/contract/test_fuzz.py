"""Every RPC of the reward, rollout and actor services, fuzzed (property-based, bounded): random bytes,
random messages built from the protos, and batches whose shapes fit but whose values are out of range
(token ids past the vocabulary, NaN, huge counts). Whatever arrives, the call ends in a status that
names the caller's mistake (never INTERNAL or UNKNOWN, and within its deadline) and the service then
serves a good request as before."""

import math
import struct
import subprocess
import sys

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshrl.clients import RewardClient
from meshrl.codec import Payload
from meshrl.config.reward import RewardConfig
from meshrl.config.rollout import RolloutConfig
from meshrl.dataproto import DataProto
from meshrl.rpc import Client, Server
from meshrl.rpc.methods import method_path
from meshrl.v1 import actor_pb2, data_pb2, reward_pb2, rollout_pb2
from services.reward.servicer import RewardServicer
from services.rollout.servicer import RolloutServicer

REWARD = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]
ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}
SEQUENCE = ["input_ids", "attention_mask", "position_ids"]
RESPONSE = [
    "responses",
    "response_mask",
    "advantages",
    "returns",
    "values",
    "actor_logprobs",
    "ref_logprobs",
    "old_log_probs",
    "token_level_scores",
    "rollout_logprobs",
]
COLUMNS = ["prompt", "uid", "data_source", "reward_model", "extra_info", "response_text", "x" * 300]
INTS = [0, 1, 2, 5, 31, 63, 64, 127, 255, 256, 10**4, 2**31 - 1, 2**31, 2**53, 2**63 - 1, -1, -(2**63)]
FLOATS = [0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, math.inf, -math.inf, math.nan]
TEXT = st.one_of(
    st.sampled_from(
        [
            "",
            "x",
            "1+1=",
            "../..",
            "/etc/passwd",
            "\x00",
            "é" * 50,
            "x" * 10_000,
            "127.0.0.1:1",
            "shm",
            "stream",
            "cuda_ipc",
            "ppo",
            "dpo",
            "sft",
            "value",
        ]
    ),
    st.text(max_size=20),
)
PACK = {
    data_pb2.FLOAT32: "f",
    data_pb2.FLOAT64: "d",
    data_pb2.INT64: "q",
    data_pb2.INT32: "i",
    data_pb2.INT8: "b",
    data_pb2.UINT8: "B",
    data_pb2.BOOL: "B",
}


def value(depth: int = 0):
    leaves = [
        st.builds(lambda: data_pb2.Value(null_value=True)),
        st.builds(lambda b: data_pb2.Value(bool_value=b), st.booleans()),
        st.builds(lambda i: data_pb2.Value(int_value=i), st.sampled_from(INTS)),
        st.builds(lambda f: data_pb2.Value(float_value=f), st.sampled_from(FLOATS)),
        st.builds(lambda s: data_pb2.Value(string_value=s), TEXT),
    ]
    if depth < 2:
        leaves.append(
            st.builds(
                lambda vs: data_pb2.Value(list_value=data_pb2.ListValue(values=vs)),
                st.lists(value(depth + 1), max_size=3),
            )
        )
        leaves.append(
            st.builds(
                lambda kv: data_pb2.Value(map_value=data_pb2.MapValue(fields=kv)),
                st.dictionaries(
                    st.sampled_from(["role", "content", "ground_truth", "x"]), value(depth + 1), max_size=3
                ),
            )
        )
    return st.one_of(leaves)


def pack(dtype: int, values: list) -> bytes:
    code = PACK[dtype]
    if code not in "fd":  # wrap into the type's range, as a sender's own cast would
        bits = {"q": 64, "i": 32, "b": 8, "B": 8}[code]
        values = [v % (1 << bits) for v in values]
        if code != "B":
            values = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in values]
    return struct.pack(f"<{len(values)}{code}", *values)


@st.composite
def wild_tensor(draw, name: str, rows: int, width: int):
    """Any dtype and shape, data that may not fit them, values from the edge pools."""
    dtype = draw(st.sampled_from([*PACK, data_pb2.FLOAT16, data_pb2.BFLOAT16, 0, 99]))
    shape = draw(st.one_of(st.just([rows, width]), st.just([rows]), st.lists(st.integers(-2, 6), max_size=3)))
    numel = math.prod(shape) if all(d >= 0 for d in shape) else 0
    if dtype in PACK and draw(st.booleans()):
        pool = FLOATS if PACK[dtype] in "fd" else INTS
        data = pack(dtype, draw(st.lists(st.sampled_from(pool), min_size=numel, max_size=numel)))
    else:
        data = draw(st.binary(max_size=64))
    return data_pb2.Tensor(name=name, dtype=dtype, shape=shape, data=data)


def sound_batch(rows: int, prompt: int, response: int) -> data_pb2.DataProto:
    """What the orchestrator would send: token ids in the vocabulary, masks of ones, chat prompts."""
    width = prompt + response

    def t(name, dtype, values, w):
        return data_pb2.Tensor(name=name, dtype=dtype, shape=[rows, w], data=pack(dtype, values))

    ids = [4 + (i * 7) % 50 for i in range(rows * width)]
    tensors = [
        t("input_ids", data_pb2.INT64, ids, width),
        t("attention_mask", data_pb2.INT64, [1] * len(ids), width),
        t("position_ids", data_pb2.INT64, [i % width for i in range(len(ids))], width),
        t("responses", data_pb2.INT64, [4 + i % 50 for i in range(rows * response)], response),
    ]
    tensors += [t(n, data_pb2.FLOAT32, [0.5] * (rows * response), response) for n in RESPONSE[1:]]

    def strings(*v):
        return data_pb2.Column(strings=list(v) * rows)

    def values(v):
        return data_pb2.Column(values=[v] * rows)

    chat = data_pb2.Value(
        list_value=data_pb2.ListValue(
            values=[
                data_pb2.Value(
                    map_value=data_pb2.MapValue(
                        fields={
                            "role": data_pb2.Value(string_value="user"),
                            "content": data_pb2.Value(string_value="1+1="),
                        }
                    )
                )
            ]
        )
    )
    truth = data_pb2.Value(map_value=data_pb2.MapValue(fields={"ground_truth": data_pb2.Value(string_value="2")}))
    columns = {
        "prompt": values(chat),
        "uid": strings("u"),
        "data_source": strings("arithmetic"),
        "reward_model": values(truth),
        "response_text": strings("2"),
    }
    return data_pb2.DataProto(tensors=tensors, non_tensors=columns, num_rows=rows)


@st.composite
def batch(draw):
    """A DataProto message: a sound batch with at most one tensor or column made wild (the chat prompts
    alone, or the tensors alone, sometimes), or a batch wild throughout."""
    rows, prompt, response = draw(st.integers(0, 3)), draw(st.integers(0, 4)), draw(st.integers(0, 4))
    if draw(st.booleans()):
        msg = sound_batch(rows, max(1, prompt), max(1, response))
        if draw(st.integers(0, 3)) == 0:
            del msg.tensors[:]
        names = [t.name for t in msg.tensors]
        target = draw(st.sampled_from(["", *names, *COLUMNS])) if draw(st.booleans()) else ""
        if target in names:
            msg.tensors[names.index(target)].CopyFrom(draw(wild_tensor(target, rows, response)))
        elif target:
            msg.non_tensors[target].CopyFrom(column(draw, rows))
        return msg
    names = draw(st.lists(st.sampled_from(SEQUENCE + RESPONSE + ["x" * 300]), unique=True, max_size=8))
    tensors = [draw(wild_tensor(n, rows, prompt + response if n in SEQUENCE else response)) for n in names]
    cols = {c: column(draw, rows) for c in draw(st.lists(st.sampled_from(COLUMNS), unique=True, max_size=3))}
    meta = draw(st.dictionaries(st.sampled_from(["temperature", "step", "x"]), value(), max_size=2))
    counts = draw(
        st.sampled_from(
            [(rows, 0, 0), (rows, 0, rows), (rows + 1, 0, 0), (rows, 1, 2), (2**40, 0, 0), (rows, 0, 2**63)]
        )
    )
    return data_pb2.DataProto(
        tensors=tensors, non_tensors=cols, meta=meta, num_rows=counts[0], row_offset=counts[1], total_rows=counts[2]
    )


def column(draw, rows: int) -> data_pb2.Column:
    kind = draw(st.sampled_from(["strings", "values", "ints"]))
    if kind == "strings":
        return data_pb2.Column(strings=draw(st.lists(TEXT, min_size=rows, max_size=rows)))
    if kind == "ints":
        return data_pb2.Column(ints=draw(st.lists(st.sampled_from(INTS), min_size=rows, max_size=rows)))
    return data_pb2.Column(values=draw(st.lists(value(), min_size=rows, max_size=rows)))


def field_value(field, depth: int):
    F = field.__class__
    t = field.type
    if t == F.TYPE_MESSAGE:
        return message(field.message_type, depth + 1)
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return st.sampled_from(FLOATS)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_STRING:
        return TEXT
    if t == F.TYPE_BYTES:
        return st.binary(max_size=32)
    if t == F.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    lo, hi = {
        F.TYPE_INT32: (-(2**31), 2**31 - 1),
        F.TYPE_UINT32: (0, 2**32 - 1),
        F.TYPE_UINT64: (0, 2**64 - 1),
        F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
        F.TYPE_FIXED32: (0, 2**32 - 1),
        F.TYPE_FIXED64: (0, 2**64 - 1),
    }.get(t, (-(2**63), 2**63 - 1))
    return st.one_of(st.sampled_from([v for v in INTS if lo <= v <= hi] + [lo, hi]), st.integers(lo, hi))


@st.composite
def _message(draw, descriptor, depth: int):
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    if descriptor.full_name == "meshrl.v1.DataProto":
        return draw(batch())
    if descriptor.full_name == "meshrl.v1.Value":
        return draw(value())
    if descriptor.full_name == "meshrl.v1.SamplingParams" and draw(st.booleans()):  # sound, one field wild
        msg = cls(n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=-1, logprobs=True, seed=1)
        wild = draw(st.sampled_from([None, *descriptor.fields]))
        if wild is not None:
            msg.ClearField(wild.name)
            if wild.is_repeated:
                getattr(msg, wild.name).extend(draw(st.lists(field_value(wild, depth), max_size=2)))
            else:
                setattr(msg, wild.name, draw(field_value(wild, depth)))
        return msg
    msg = cls()
    for f in descriptor.fields:
        if depth > 3 or draw(st.integers(0, 7)) < (1 if f.type == f.TYPE_MESSAGE else 4):
            continue  # a message field (data, sampling, loss) mostly there, a scalar half the time
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key, val = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            for k, v in draw(st.dictionaries(field_value(key, depth), field_value(val, depth), max_size=3)).items():
                if val.type == val.TYPE_MESSAGE:
                    getattr(msg, f.name)[k].CopyFrom(v)
                else:
                    getattr(msg, f.name)[k] = v
        elif f.is_repeated:
            getattr(msg, f.name).extend(draw(st.lists(field_value(f, depth), max_size=3)))
        elif f.type == f.TYPE_MESSAGE:
            getattr(msg, f.name).CopyFrom(draw(field_value(f, depth)))
        else:
            setattr(msg, f.name, draw(field_value(f, depth)))
    return msg


def message(descriptor, depth: int = 0):
    return _message(descriptor, depth)


@st.composite
def request(draw, service):
    """(method, list of raw request messages): random bytes, or one or more messages from the proto."""
    carriers = [
        m
        for m in service.methods
        if "data" in m.input_type.fields_by_name and m.input_type.fields_by_name["data"].message_type is not None
    ]
    method = draw(st.sampled_from([*service.methods, *carriers, *carriers]))  # the batch methods go deepest
    if draw(st.integers(0, 4)) == 0:
        parts = draw(st.lists(st.binary(max_size=200), min_size=1, max_size=3))
    else:
        parts = [
            m.SerializeToString()
            for m in draw(
                st.lists(
                    message(method.input_type),
                    min_size=1,
                    max_size=draw(st.sampled_from([1, 1, 1, 2])) if method.client_streaming else 1,
                )
            )
        ]
    return method, parts


def call(channel, method, parts, token_metadata=()):
    kind = {
        (False, False): channel.unary_unary,
        (True, False): channel.stream_unary,
        (False, True): channel.unary_stream,
        (True, True): channel.stream_stream,
    }
    stub = kind[(method.client_streaming, method.server_streaming)](method_path(method))
    reply = stub(iter(parts) if method.client_streaming else parts[0], timeout=60, metadata=token_metadata)
    if method.server_streaming:
        list(reply)


def fuzz(address: str, service, healthy, examples: int):
    channel = grpc.insecure_channel(address)

    @settings(
        max_examples=examples, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(request(service))
    def one(req):
        method, parts = req
        try:
            call(channel, method, parts)
        except grpc.RpcError as e:
            assert e.code() not in BAD, f"{method.name}: {e.code().name}: {e.details()}"
            assert len(e.details() or "") <= 4096, f"{method.name}: details of {len(e.details())} characters"

    one()
    healthy()


@pytest.fixture(scope="module")
def reward():
    servicer = RewardServicer(RewardConfig(workers=1))
    server = Server([servicer]).start()
    yield server.address
    server.stop(0)
    servicer.close()


@pytest.fixture(scope="module")
def rollout_address(tiny_lm):
    servicer = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=64, max_samples=64))
    server = Server([servicer]).start()
    yield server.address
    server.stop(0)
    servicer.close()


@pytest.fixture(scope="module")
def actor_address(tiny_lm, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_ckpt")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "actor", "--model", str(tiny_lm), "--checkpoint-root", str(root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert "listening on" in line, line
    yield line.split()[-1]
    proc.terminate()
    assert proc.wait(60) == 0  # and it stops cleanly after all that


def chat_batch(rows=2):
    return DataProto(
        non_tensor_batch={
            "prompt": [[{"role": "user", "content": "1+1="}]] * rows,
            "uid": [f"u{i}" for i in range(rows)],
        }
    )


def test_the_reward_service_survives_any_request(reward):
    def healthy():
        scores = RewardClient(reward, timeout=60).score(
            DataProto(
                non_tensor_batch={
                    "response_text": ["2", "3"],
                    "data_source": ["arithmetic"] * 2,
                    "reward_model": [{"ground_truth": "2"}] * 2,
                }
            )
        )
        assert scores.scores.tolist() == [1.0, 0.0]

    fuzz(reward, REWARD, healthy, examples=200)


def test_the_rollout_service_survives_any_request(rollout_address):
    def healthy():
        client = Client(rollout_address, ROLLOUT, timeout=60)
        client.call("WakeUp")
        out = client.call(
            "Generate",
            Payload(
                rollout_pb2.GenerateRequest(
                    sampling=rollout_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=4, logprobs=True)
                ),
                chat_batch(),
            ),
        )
        assert len(out.data) == 4

    fuzz(rollout_address, ROLLOUT, healthy, examples=300)


def test_the_actor_service_survives_any_request(actor_address):
    def healthy():
        client = Client(actor_address, ACTOR, timeout=120)
        client.call("Reload")
        assert client.call("Describe").service == "actor"

    fuzz(actor_address, ACTOR, healthy, examples=200)


def test_the_issues_cases_are_the_callers_mistakes(rollout_address, reward, actor_address, tiny_lm):
    """The cases found by hand before the fuzzer: bad wire format, token ids past the vocabulary (they
    reached the model), a response mask of width 0, an error quoting a 10,000-character name."""

    def status(address, method, parts):
        try:
            call(grpc.insecure_channel(address), method, parts)
        except grpc.RpcError as e:
            return e.code(), e.details()
        return grpc.StatusCode.OK, ""

    generate, score = ROLLOUT.methods_by_name["Generate"], REWARD.methods_by_name["Score"]
    logprobs = ACTOR.methods_by_name["ComputeLogProbs"]
    assert status(reward, REWARD.methods_by_name["Describe"], [b"\xff"])[0] == grpc.StatusCode.INVALID_ARGUMENT
    past = sound_batch(1, 3, 2)
    past.tensors[0].data = pack(data_pb2.INT64, [4, 10**6, 5, 6, 7])
    sampling = rollout_pb2.SamplingParams(n=1, max_new_tokens=2, temperature=1.0)
    code, details = status(
        rollout_address, generate, [rollout_pb2.GenerateRequest(data=past, sampling=sampling).SerializeToString()]
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "token id 1000000 is outside the vocabulary" in details
    code, details = status(actor_address, logprobs, [actor_pb2.BatchRequest(data=past).SerializeToString()])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "'input_ids' holds values outside" in details
    many = rollout_pb2.GenerateRequest(
        data=sound_batch(2, 3, 2), sampling=rollout_pb2.SamplingParams(n=2**31, max_new_tokens=2, temperature=1.0)
    )
    code, details = status(rollout_address, generate, [many.SerializeToString()])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "exceeds the rollout's limit of 64 samples" in details
    empty = sound_batch(2, 3, 2)
    empty.tensors[4].CopyFrom(data_pb2.Tensor(name="response_mask", dtype=data_pb2.FLOAT32, shape=[2, 0]))
    assert status(reward, score, [reward_pb2.ScoreRequest(data=empty).SerializeToString()])[0] == grpc.StatusCode.OK
    named = sound_batch(1, 3, 2)
    named.tensors.append(data_pb2.Tensor(name="n" * 10_000, dtype=99, shape=[1]))
    code, details = status(reward, score, [reward_pb2.ScoreRequest(data=named).SerializeToString()])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and len(details) <= 2000


@pytest.mark.parametrize("flat", ["input_ids", "responses"])
def test_a_one_dimensional_sequence_is_refused_by_name(actor_address, flat):
    """A 1-D input_ids or responses reached the servicer's prompt slicing before the batch's checks
    (INTERNAL IndexError): it is the caller's mistake, named, and the service goes on serving."""
    bad = sound_batch(2, 3, 2)
    names = [t.name for t in bad.tensors]
    flat_tensor = data_pb2.Tensor(name=flat, dtype=data_pb2.INT64, shape=[2], data=pack(data_pb2.INT64, [4, 5]))
    bad.tensors[names.index(flat)].CopyFrom(flat_tensor)
    # a step after the last one applied: the module's fuzzing may have applied any step before this test
    last = int(Client(actor_address, ACTOR, timeout=60).call("Describe").details.get("last_step", "0") or 0)
    sft = actor_pb2.UpdateRequest(step=last + 1, loss=actor_pb2.LossSpec(name="sft"), data=bad)
    for method, msg in (("ComputeLogProbs", actor_pb2.BatchRequest(data=bad)), ("Update", sft)):
        with pytest.raises(grpc.RpcError) as e:
            call(grpc.insecure_channel(actor_address), ACTOR.methods_by_name[method], [msg.SerializeToString()])
        details = e.value.details() or ""
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"tensor '{flat}' must be" in details, details
    assert Client(actor_address, ACTOR, timeout=60).health() == "SERVING"
