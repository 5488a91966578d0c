"""`meshrl serve gateway` as a user starts it: the real command in front of two real rollout services
(hf backend, the Qwen2.5-shaped tiny model and its ChatML template), spoken to with the `openai` client.
A chat gets the model's own tokens with their log-probs; n > 1 and a seed are honoured; a replica that
is gone sends the session's calls to the other one; a key the gateway was not given is refused."""

import time

import openai
import pytest
from calls import served_gateway

from meshrl.config.rollout import RolloutConfig
from meshrl.rpc import Server
from services.rollout.servicer import RolloutServicer


@pytest.fixture(scope="module")
def fleet(bpe_lm):
    servicers = [RolloutServicer(RolloutConfig(model=str(bpe_lm), backend="hf", max_model_len=512)) for _ in range(2)]
    servers = [Server([s]).start() for s in servicers]
    yield servers
    for server, servicer in zip(servers, servicers):
        server.stop(0)
        servicer.close()


@pytest.fixture(scope="module")
def gateway(fleet, bpe_lm):
    # the context is the rollouts' own (512), read from their Describe; no cap on max_tokens
    with served_gateway(",".join(s.address for s in fleet), bpe_lm, "sk-a,sk-b") as url:
        yield url


def test_a_chat_through_the_served_gateway(gateway):
    c = openai.OpenAI(base_url=gateway, api_key="sk-a", max_retries=0)
    messages = [{"role": "user", "content": "2+2="}]
    one = c.chat.completions.create(model="bpe", messages=messages, max_tokens=8, logprobs=True, seed=3)
    again = c.chat.completions.create(model="bpe", messages=messages, max_tokens=8, logprobs=True, seed=3)
    assert one.choices[0].message.content == again.choices[0].message.content  # the seed is honoured
    lps = [t.logprob for t in one.choices[0].logprobs.content]
    assert lps and all(lp <= 0 for lp in lps) and one.usage.completion_tokens == len(lps)
    many = c.chat.completions.create(model="bpe", messages=messages, max_tokens=8, n=3, temperature=1.0)
    assert len(many.choices) == 3
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway, api_key="sk-nope", max_retries=0).models.list()


def test_the_sdks_default_request_gets_the_room_left(gateway):
    """Issue 58.3: no max_tokens (the openai SDK's default) was capped at 1024 past the rollout's 512 and
    answered 503; now it is the room the rollout's context leaves, and too long a prompt is a 400."""
    c = openai.OpenAI(base_url=gateway, api_key="sk-b", max_retries=0)
    reply = c.chat.completions.create(model="bpe", messages=[{"role": "user", "content": "2+2="}])
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= 512
    with pytest.raises(openai.BadRequestError, match="context_length_exceeded|takes 512"):
        c.completions.create(model="bpe", prompt=[5] * 600)


def test_a_lost_replica_sends_the_session_to_the_other(gateway, fleet):
    fleet[0].stop(0)  # the replica sk-a's session was given (the first, when none held a session)
    time.sleep(0.5)
    c = openai.OpenAI(base_url=gateway, api_key="sk-a", max_retries=0)
    reply = c.chat.completions.create(model="bpe", messages=[{"role": "user", "content": "1+1="}], max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
