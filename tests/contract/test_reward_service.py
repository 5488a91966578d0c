"""The reward service over a real gRPC server on 127.0.0.1, scored through RewardClient."""

import pathlib
import subprocess
import sys
import threading

import grpc
import pytest
import torch

from meshrl.clients import RewardClient
from meshrl.codec import Payload
from meshrl.config.reward import RewardConfig
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.rpc import Server, serve
from meshrl.v1 import reward_pb2
from services.reward.servicer import RewardServicer

FUNCS = pathlib.Path(__file__).parent / "reward_functions.py"


def start(cfg: RewardConfig):
    servicer = RewardServicer(cfg)
    server = Server([servicer]).start()
    return server, servicer, RewardClient(server.address, timeout=120)


@pytest.fixture(scope="module")
def rules():
    server, servicer, client = start(RewardConfig(workers=2))
    yield client
    server.stop(0)
    servicer.close()


@pytest.fixture(scope="module")
def user_fn():
    server, servicer, client = start(
        RewardConfig(function=f"{FUNCS}:compute_score", workers=2, timeout=1.0, on_error="score", error_score=-1.0)
    )
    yield client
    server.stop(0)
    servicer.close()


def samples(responses, truths, source="arithmetic", **columns):
    return DataProto(
        non_tensor_batch={
            "response_text": responses,
            "data_source": [source] * len(responses),
            "reward_model": [{"ground_truth": g} for g in truths],
            **columns,
        }
    )


def test_describe(rules):
    info = rules.describe()
    assert info.service == "reward" and info.backend == "rule"


def test_rule_scores_in_order_with_extras(rules):
    out = rules.score(samples(["7", "8", "seven", "12\nbecause"], ["7", "7", "7", "12"]))
    assert out.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert list(out.columns["acc"]) == [True, False, False, True]
    assert list(out.columns["reward_status"]) == ["ok"] * 4
    assert out.metrics["reward/score/mean"] == 0.5 and out.metrics["reward/acc/mean"] == 0.5


def test_mixed_data_sources_pick_their_scorers(rules):
    batch = DataProto(
        non_tensor_batch={
            "response_text": ["7", "#### 1,000", "\\boxed{\\frac{1}{2}}"],
            "data_source": ["arithmetic", "openai/gsm8k", "lighteval/MATH"],
            "reward_model": [{"ground_truth": "7"}, {"ground_truth": "1000"}, {"ground_truth": "0.5"}],
        }
    )
    assert rules.score(batch).scores.tolist() == [1.0, 1.0, 1.0]


def test_token_level_scores_follow_the_response_mask(rules):
    batch = samples(["7", "3"], ["7", "7"])
    batch.batch["response_mask"] = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = rules.score(batch)
    assert out.token_level_scores.tolist() == [[0, 1, 0], [0, 0, 0]]


def test_a_large_batch_streams_and_keeps_its_order(rules):
    n = 20000
    truths = [str(i) for i in range(n)]
    responses = [str(i) if i % 3 else "x" for i in range(n)]
    out = rules.score(samples(responses, truths, prompt_text=["p" * 200] * n))  # ~5 MB of text
    assert out.scores.tolist() == [float(i % 3 != 0) for i in range(n)]


@pytest.mark.parametrize(
    "batch,match",
    [
        (DataProto(non_tensor_batch={"data_source": ["arithmetic"]}), "column 'response_text' is missing"),
        (samples([7], ["7"]), "row 0: response_text is a int, not text"),
        (
            DataProto(
                non_tensor_batch={
                    "response_text": ["7", "8"],
                    "data_source": ["arithmetic"] * 2,
                    "reward_model": [{"ground_truth": "7"}, {"style": "rule"}],
                }
            ),
            "row 1: reward_model.ground_truth is missing",
        ),
        (samples(["7"], ["7"], source="unknown/set"), "row 0: no built-in scorer for data_source 'unknown/set'"),
        (
            DataProto(non_tensor_batch={"response_text": ["7"], "data_source": ["arithmetic"], "reward_model": ["7"]}),
            "row 0: reward_model is a str",
        ),
    ],
)
def test_bad_input_is_invalid_argument_then_the_service_goes_on(rules, batch, match):
    with pytest.raises(ServiceError) as e:
        rules.score(batch)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and match in e.value.details
    assert rules.score(samples(["1"], ["1"])).scores.tolist() == [1.0]


def test_user_function_failures_are_isolated_and_counted(user_fn):
    responses = ["7", "hang", "8", "die", "nan", "str", "raise", "9"]
    out = user_fn.score(samples(responses, ["7", "0", "8", "0", "0", "0", "0", "9"], source="anything"))
    assert out.scores.tolist() == [1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0]
    status = list(out.columns["reward_status"])
    assert status == ["ok", "timeout", "ok", "error", "error", "error", "error", "ok"]
    errors = list(out.columns["reward_error"])
    assert "timed out after 1s" in errors[1]
    assert "worker process died while scoring (exit code 3)" in errors[3]
    assert "returned nan" in errors[4] and "returned a str" in errors[5] and "ZeroDivisionError" in errors[6]
    assert out.metrics["reward/num_failed"] == 5 and out.metrics["reward/num_timeout"] == 1
    assert list(out.columns["length"])[:3] == [1, None, 1]
    # the pool replaced its dead and hung workers and still scores
    assert user_fn.score(samples(["5"] * 50, ["5"] * 50, source="x")).scores.sum().item() == 50


def test_fail_policy_names_the_sample():
    server, servicer, client = start(RewardConfig(function=f"{FUNCS}:compute_score", workers=1, timeout=1.0))
    try:
        with pytest.raises(ServiceError) as e:
            client.score(samples(["1", "raise", "nan"], ["1", "1", "1"], source="s"))
        assert e.value.code == grpc.StatusCode.ABORTED
        assert "row 1 (data_source 's'): ZeroDivisionError: division by zero (2 of 3 samples failed)" in e.value.details
        assert client.score(samples(["1"], ["1"], source="s")).scores.tolist() == [1.0]
    finally:
        server.stop(0)
        servicer.close()


def test_batched_user_function():
    server, servicer, client = start(RewardConfig(function=f"{FUNCS}:compute_score_batched", batched=True))
    try:
        out = client.score(samples([str(i % 2) for i in range(100)], ["1"] * 100, source="s"))
        assert out.scores.tolist() == [float(i % 2) for i in range(100)]
    finally:
        server.stop(0)
        servicer.close()


@pytest.mark.parametrize(
    "name, batched, workers",
    [
        ("compute_score_batched_reordered", True, 1),
        ("compute_score_batched_reordered", True, 0),
        ("compute_score_keyword_only", False, 1),
        ("compute_score_keyword_only", False, 0),
    ],
)
def test_arguments_are_passed_by_keyword_as_verl_does(name, batched, workers):
    """Another parameter order used to score everything 0 with status ok; keyword-only parameters failed."""
    server, servicer, client = start(RewardConfig(function=f"{FUNCS}:{name}", batched=batched, workers=workers))
    try:
        out = client.score(samples(["1", "2", "3"], ["1", "0", "3"], source="s"))
        assert out.scores.tolist() == [1.0, 0.0, 1.0]
        assert set(out.columns["reward_status"]) == {"ok"}
    finally:
        server.stop(0)
        servicer.close()


def test_a_function_verl_could_not_call_is_refused_at_start(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("def compute_score(source, text, truth):\n    return 1.0\n")
    with pytest.raises(
        ValueError,
        match=r"parameter\(s\) \['source', 'text', 'truth'\] are not what verl passes; "
        r"it calls compute_score\(data_source=..., solution_str=...",
    ):
        RewardServicer(RewardConfig(function=f"{f}:compute_score", workers=0))


def test_batched_function_with_the_wrong_count_fails_its_samples():
    server, servicer, client = start(RewardConfig(function=f"{FUNCS}:compute_score_batched_short", batched=True))
    try:
        with pytest.raises(ServiceError) as e:
            client.score(samples(["1"] * 10, ["1"] * 10, source="s"))
        assert "batched function returned 4 results for 5 samples" in e.value.details
    finally:
        server.stop(0)
        servicer.close()


def test_a_function_that_cannot_load_stops_the_start(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('no GPU for my reward')\n")
    with pytest.raises(ValueError, match="could not load reward function .*no GPU for my reward"):
        RewardServicer(RewardConfig(function=f"{bad}:compute_score", workers=1))


def test_in_process_mode_scores_without_workers():
    servicer = RewardServicer(RewardConfig(function=f"{FUNCS}:compute_score", workers=0, on_error="score"))
    reply = servicer.Score(Payload(reward_pb2.ScoreRequest(), samples(["1", "raise"], ["1", "1"], source="s")), None)
    assert reply.data.batch["scores"].tolist() == [1.0, 0.0]


def test_reward_model_scores_prompt_and_response(tiny_rm):
    server, servicer, client = start(RewardConfig(model=str(tiny_rm), batch_size=3))
    try:
        batch = samples(["7", "8", "a much longer response", "7"], ["7"] * 4, prompt_text=["3+4="] * 4)
        a, b = client.score(batch), client.score(batch)
        assert torch.isfinite(a.scores).all() and torch.equal(a.scores, b.scores)
        # the same sample scores the same whatever its batch-mates (padding) are
        assert torch.allclose(a.scores[0], a.scores[3], atol=1e-5) and a.scores[0] != a.scores[1]
        assert client.describe().backend == "model"
    finally:
        server.stop(0)


def test_concurrent_clients(rules):
    errors = []

    def work(k):
        try:
            c = RewardClient(rules.address)
            for _ in range(3):
                out = c.score(samples([str(k)] * 40, [str(k)] * 40))
                assert out.scores.sum().item() == 40
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors


class WrongCount:
    """A remote reward server that answers with one score too few (not ours: any server may)."""

    SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]

    def Score(self, request, context):
        n = len(request.data) - 1
        return Payload(reward_pb2.ScoreResponse(), DataProto({"scores": torch.ones(n)}))


def test_client_refuses_a_reply_with_the_wrong_number_of_scores():
    server = serve(WrongCount())
    try:
        with pytest.raises(ValueError, match=r"returned \[2\] scores for 3 samples"):
            RewardClient(server.address).score(samples(["1", "2", "3"], ["1"] * 3))
    finally:
        server.stop(0)


def test_meshrl_serve_reward_cli(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "reward", "--workers", "1"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line
        client = RewardClient(line.rsplit(" ", 1)[1].strip())
        client.wait_ready(30)
        assert client.score(samples(["3"], ["3"])).scores.tolist() == [1.0]
        proc.terminate()
        assert proc.wait(20) == 0
    finally:
        proc.kill()


@pytest.mark.parametrize("workers", [2, 0])
def test_a_trl_reward_function_scores_with_dataset_columns_and_none(workers):
    """TRL's accuracy_reward(completions, solution, **kwargs) was refused at start; now it is called as TRL
    calls it: completions as messages for chat prompts (text for text prompts), the row's dataset columns
    by name, and None scores 0, counted in reward/num_none and left out of reward/score/mean."""
    server, servicer, client = start(RewardConfig(function=f"{FUNCS}:accuracy_reward", workers=workers))
    try:
        chat = [{"role": "user", "content": "1+1="}]
        batch = DataProto(
            non_tensor_batch={
                "response_text": ["2", "3", "skip", "4"],
                "prompt_text": ["1+1="] * 3 + ["2+2="],
                "dataset_columns": [
                    {"prompt": chat, "solution": "2"},
                    {"prompt": chat, "solution": "2"},
                    {"prompt": chat, "solution": "2"},
                    {"prompt": "2+2=", "solution": "4"},
                ],
            }
        )
        out = client.score(batch)
        assert out.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
        assert list(out.columns["reward_status"]) == ["ok"] * 4
        assert out.metrics["reward/num_none"] == 1.0
        assert out.metrics["reward/score/mean"] == pytest.approx(2 / 3)  # of the three it scored
    finally:
        server.stop(0)
        servicer.close()


def test_a_trl_reward_function_sees_prompts_completions_and_columns_as_trl_passes_them():
    server, servicer, client = start(RewardConfig(function=f"{FUNCS}:trl_echo", workers=1))
    try:
        chat = [{"role": "user", "content": "1+1="}]
        columns = [{"prompt": chat, "solution": "2"}, {"prompt": "2+2=", "solution": "4", "level": 3}]
        out = client.score(samples(["2", "4"], ["2", "4"], source="s", dataset_columns=columns))
        assert out.scores.tolist() == [1.0, 1.0]
        # verl's columns only (no dataset_columns): the prompt text, completions as text
        assert client.score(samples(["2"], ["2"], source="s", prompt_text=["1+1="])).scores.tolist() == [1.0]
    finally:
        server.stop(0)
        servicer.close()


def test_a_function_of_neither_form_is_refused_naming_both(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("def reward(responses, answers):\n    return [1.0]\n")
    with pytest.raises(ValueError, match=r"is neither reward function form.*TRL calls f\(prompts=..., completions="):
        RewardServicer(RewardConfig(function=f"{f}:reward", workers=0))
