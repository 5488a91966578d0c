"""reward.url (services/reward/remote.py): what is sent to an OpenRLHF-style server, how its reply becomes
outcomes, the setting's own checks, and what the orchestrator adds to a Score request for it."""

import json
import math
import re

import pytest
from transformers import AutoTokenizer

from meshrl.chat import render
from meshrl.config.reward import RewardConfig
from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from orchestrator.lifecycle.mesh import reward_request
from services.reward.remote import read_reply, request_body
from services.reward.samples import Sample

WHERE = "reward.url=http://rm:5000/get_reward"
USER = [{"role": "user", "content": "10+2="}]


def sample(response="5", truth=None, prompt_text=None, rendered=None, sequence=None) -> Sample:
    return Sample("arithmetic", prompt_text, response, truth, None, prompt_rendered=rendered, sequence_text=sequence)


def test_the_request_is_openrlhfs_query_prompts_and_labels():
    chunk = [
        sample("5", "5", "2+3=", "<|user|>2+3=<|assistant|>", "<|user|>2+3=<|assistant|>5</s>"),
        sample("7", None, "3+4="),  # a client that sent no rendered texts: the prompt text and response
        sample("x", 12),
    ]
    assert request_body(chunk) == {
        "query": ["<|user|>2+3=<|assistant|>5</s>", "3+4=7", "x"],
        "prompts": ["<|user|>2+3=<|assistant|>", "3+4=", ""],
        "labels": ["5", "", 12],  # "" without a label, as OpenRLHF sends it; a label goes as the data holds it
    }


def test_a_reply_with_rewards_scores_and_extra_logs():
    reply = {"rewards": [1, 0.5], "scores": [1.0, 0.0], "extra_logs": {"acc": [True, False], "mean": 0.5}}
    out = read_reply(json.dumps(reply), 2, WHERE)
    assert [o.score for o in out] == [1.0, 0.5] and all(o.error is None for o in out)
    assert [o.extras for o in out] == [{"remote_score": 1.0, "acc": True}, {"remote_score": 0.0, "acc": False}]
    assert [o.score for o in read_reply('{"rewards": [-2]}', 1, WHERE)] == [-2.0]  # OpenRLHF's oldest reply


@pytest.mark.parametrize(
    "text, match",
    [
        ("<html>Internal Server Error</html>", r"answered with something other than JSON: '<html>Internal"),
        ('{"scores": [1, 1]}', r"answered without a 'rewards' list \(keys \['scores'\]\)"),
        ("[1, 1]", r"answered without a 'rewards' list \(a list\)"),
        ('{"rewards": 1}', r"answered without a 'rewards' list"),
        ('{"rewards": [1, 1, 1]}', r"answered 3 rewards for 2 samples"),
    ],
)
def test_a_bad_reply_fails_every_sample_of_its_chunk(text, match):
    out = read_reply(text, 2, WHERE)
    errors = [o.error or "" for o in out]
    assert all(o.score is None for o in out) and all(e.startswith(WHERE) for e in errors)
    assert len(out) == 2 and all(re.search(match, e) for e in errors)


@pytest.mark.parametrize("bad", [math.nan, math.inf, None, "1.0", True, [1.0]])
def test_a_reward_that_is_not_a_finite_number_fails_its_sample_only(bad):
    text = json.dumps({"rewards": [bad, 1.0]})  # json writes nan and inf as NaN and Infinity, which it reads back
    first, second = read_reply(text, 2, WHERE)
    assert first.error == f"{WHERE} gave the reward {bad!r}" and first.score is None
    assert second.score == 1.0 and second.error is None


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"url": "localhost:5000/get_reward"}, r"url=localhost:5000/get_reward must be http\(s\)://HOST\[:PORT\]/PATH"),
        ({"url": "ftp://rm/get_reward"}, r"must be http\(s\)://"),
        ({"url": "http://rm:70000/get_reward"}, r"must be http\(s\)://"),
        ({"url": "http:///get_reward"}, r"must be http\(s\)://"),
        ({"url": "http://rm/", "model": "m"}, r"^model and url both set"),
        ({"url": "http://rm/", "function": "f.py:g"}, r"^function and url both set"),
    ],
)
def test_reward_url_is_checked_when_read(settings, match):
    with pytest.raises(ValueError, match=match):
        RewardConfig(**settings)


def test_reward_url_is_a_backend_of_its_own():
    assert RewardConfig(url="http://rm:5000/get_reward").backend == "url"
    assert RewardConfig(url="https://rm.example/score").backend == "url"


def test_the_rendered_texts_travel_only_for_reward_url(tiny_lm):
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    chats = [[{"role": "user", "content": "2+3="}], [{"role": "system", "content": "be brief"}, *USER]]
    prompts = [render(tok, chat, "test") for chat in chats]
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    response_ids = [tok("5", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], tok("12")["input_ids"]]
    gen = DataProto(rollout_tensors(prompt_ids, response_ids, tok.pad_token_id), {"response_text": ["5", "12"]})
    lean = reward_request(gen)  # no tokenizer: no scorer needs the texts, and they are not sent
    assert "prompt_rendered" not in lean.non_tensor_batch and "sequence_text" not in lean.non_tensor_batch
    cols = reward_request(gen, tok).non_tensor_batch  # padding (left of a prompt, right of a response) left out
    assert list(cols["prompt_rendered"]) == prompts
    assert list(cols["sequence_text"]) == [prompts[0] + "5" + tok.eos_token, prompts[1] + "12"]
