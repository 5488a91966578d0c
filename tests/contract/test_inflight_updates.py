"""In-flight weight updates (rollout.on_update=keep|recompute, services/rollout/gate.py) on both backends: a push sent
while a long Generate runs returns before it does; the Generate pauses between steps while the weights
load and goes on with the new weights and the KV cache it had, so its reply's tokens carry two versions,
the tokens before the switch are the old weights' and the tokens after it are what the new weights
generate from the same prefix and cache (greedy); a Generate sent after the push has only the new
weights; a caller that leaves while parked is let go. On vLLM each sample switches where the update finds it,
and its tokens and log-probs before the switch are those of a run without the push."""

import threading
import time

import pytest
import torch
from calls import ROLLOUT as SERVICE
from calls import chats, current_weights, generate, wait_until
from transformers import AutoModelForCausalLM

from meshrl import weights
from meshrl.config.rollout import RolloutConfig
from meshrl.layout import VERSIONS
from meshrl.rpc import Client, Server
from services.rollout.servicer import RolloutServicer

QUESTIONS = [f"{a}+{b}=" for a in range(10) for b in range(10)]  # 100 rows: a step takes a few ms
NEW = 40


@pytest.mark.parametrize("mode", ["keep", "recompute"])
def test_a_push_goes_in_between_the_steps_of_a_generation(tiny_lm, mode):
    """keep: the new weights go on from the cache the old ones made (what transformers' generate gives
    when handed that cache); recompute: the cache is made again from the tokens so far, so the tokens
    after the switch are the new weights' greedy continuation of the prefix, and not keep's."""
    servicer = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=64, on_update=mode))
    server = Server([servicer]).start()
    client, out = Client(server.address, SERVICE, timeout=120), {}
    new_weights = current_weights(tiny_lm, 1.3)

    def long():
        out["long"] = generate(client, chats(*QUESTIONS), greedy=True, max_new_tokens=NEW)
        out["long_end"] = time.monotonic()

    try:
        first = threading.Thread(target=long)
        first.start()
        wait_until(lambda: servicer.calls and len(servicer.calls[0].versions) >= 3)  # a few tokens in
        weights.push_state(client, new_weights, 1, "shm")
        pushed = time.monotonic()
        after = generate(client, chats("3+3="), greedy=True, max_new_tokens=4)  # sent during the long one
        first.join(120)
        reply = out["long"]
        assert pushed < out["long_end"], "the push waited for the generation"
        assert (
            after.msg.weight_version == 1
            and (after.data.batch[VERSIONS][after.data.batch["response_mask"] > 0] == 1).all()
        )
    finally:
        server.stop(0)
        servicer.close()

    data = reply.data
    versions, mask = data.batch[VERSIONS], data.batch["response_mask"] > 0
    assert reply.msg.weight_version == 0  # the oldest version among its tokens
    longest = int(mask.sum(1).argmax())
    switch = int((versions[longest] == 0).sum())  # every row switches at the same step (lockstep)
    assert 3 <= switch < NEW
    assert (versions[mask] == (torch.arange(NEW).expand_as(versions)[mask] >= switch).long()).all()

    # the reference: the old weights generate `switch` tokens, the new ones go on from their cache
    old, new = (AutoModelForCausalLM.from_pretrained(tiny_lm) for _ in range(2))
    new.load_state_dict(new_weights, strict=False)
    prompts, prompt_mask = data.batch["prompts"], data.batch["attention_mask"][:, : data.batch["prompts"].shape[1]]
    kw = {"do_sample": False, "pad_token_id": servicer.pad, "eos_token_id": servicer.backend.ends}
    first_part = old.generate(
        input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=switch, return_dict_in_generate=True, **kw
    )
    seq = first_part.sequences
    so_far = torch.cat([prompt_mask, torch.ones(len(seq), seq.shape[1] - prompts.shape[1])], 1).long()
    on_old_cache = new.generate(
        input_ids=seq,
        attention_mask=so_far,
        past_key_values=first_part.past_key_values,
        max_new_tokens=NEW - switch,
        **kw,
    )
    made_again = new.generate(input_ids=seq, attention_mask=so_far, max_new_tokens=NEW - switch, **kw)
    rest, other = (on_old_cache, made_again) if mode == "keep" else (made_again, on_old_cache)
    responses = data.batch["responses"]
    assert torch.equal(responses[:, :switch], seq[:, prompts.shape[1] :][:, :switch])
    going = mask[:, switch - 1] & mask[:, switch]  # rows still generating across the switch
    assert going.sum() > len(QUESTIONS) // 2
    want = rest[:, seq.shape[1] :]
    width = min(want.shape[1], responses.shape[1] - switch)
    got = responses[going, switch : switch + width] * mask[going, switch : switch + width]
    assert torch.equal(got, want[going, :width] * mask[going, switch : switch + width])
    assert not torch.equal(got, other[going, seq.shape[1] :][:, :width] * mask[going, switch : switch + width])
    # and not what the old weights would have gone on to say
    assert not torch.equal(
        got,
        old.generate(input_ids=seq, attention_mask=rest.new_ones(seq.shape), max_new_tokens=width, **kw)[
            going, seq.shape[1] :
        ][:, :width]
        * mask[going, switch : switch + width],
    )


def test_a_caller_that_leaves_while_parked_is_let_go(tiny_lm):
    """An update that loads its first bucket and never finishes keeps the calls in flight paused (the
    weights are torn); one whose caller's deadline passes ends then, and the servicer counts it gone."""
    from meshrl.errors import ServiceError

    servicer = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=64, on_update="keep"))
    server = Server([servicer]).start()
    client = Client(server.address, SERVICE, timeout=120)
    try:
        servicer.gate.pause()  # as a half-loaded update leaves it
        short = Client(server.address, SERVICE, timeout=1.5)
        with pytest.raises(ServiceError) as e:
            generate(short, chats("1+1="), max_new_tokens=4)
        assert e.value.code.name in ("DEADLINE_EXCEEDED", "ABORTED")
        wait_until(lambda: not servicer.calls, 10)
        assert servicer.gate.running == 0
        servicer.gate.resume(0)
        assert generate(client, chats("1+1="), max_new_tokens=4).msg.weight_version == 0
    finally:
        server.stop(0)
        servicer.close()


@pytest.mark.parametrize("mode", ["keep", "recompute"])
def test_on_vllm_a_push_goes_in_between_the_engines_steps(tiny_lm, mode):
    """The same on vLLM (continuous batching: each sample's tokens are counted as they come): the push returns
    before the Generate; each sample's tokens before its switch are those of a run without the push, with the
    same log-probs, and the tokens after it come from the new weights. recompute: the requests in flight
    recompute their KV on the new weights, so what follows a sample's switch is what a fresh greedy
    Generate from its tokens so far gives with the new weights."""
    cfg = RolloutConfig(model=str(tiny_lm), backend="vllm", max_model_len=512, on_update=mode)
    servicer = RolloutServicer(cfg)
    server = Server([servicer]).start()
    client, out = Client(server.address, SERVICE, timeout=300), {}
    questions = chats(*QUESTIONS[:25]) if mode == "keep" else chats(*QUESTIONS)
    sampling = {"n": 4, "seed": 5, "temperature": 1.0} if mode == "keep" else {"greedy": True}
    sampling["max_new_tokens"] = 150
    try:
        plain = generate(client, questions, **sampling).data

        def long():
            out["long"] = generate(client, questions, **sampling)
            out["long_end"] = time.monotonic()

        first = threading.Thread(target=long)
        first.start()
        wait_until(lambda: servicer.calls and len(servicer.calls[0].versions) >= 5)
        weights.push_state(client, current_weights(tiny_lm, 1.3), 1, "shm")
        pushed = time.monotonic()
        first.join(300)
        data, reply = out["long"].data, out["long"]
        versions, mask = data.batch[VERSIONS], data.batch["response_mask"] > 0
        if mode == "recompute":  # each switched sample's tokens so far, continued greedily by the new weights
            switch = (versions == 0).sum(1)
            rows = [i for i in range(len(data)) if 0 < switch[i] < mask[i].sum() - 8]
            prefixes = [
                data.batch["prompts"][i][data.batch["attention_mask"][i, : data.batch["prompts"].shape[1]] > 0].tolist()
                + data.batch["responses"][i, : switch[i]].tolist()
                for i in rows
            ]
            fresh = generate(client, token_prompts(prefixes), greedy=True, max_new_tokens=8).data
    finally:
        server.stop(0)
        servicer.close()
    assert pushed < out["long_end"], "the push waited for the generation"
    assert reply.msg.weight_version == 0 and set(versions[mask].tolist()) == {0, 1}
    old = (versions == 0) & mask
    assert torch.equal(data.batch["responses"][old], plain.batch["responses"][old])
    assert torch.allclose(data.batch["rollout_logprobs"][old], plain.batch["rollout_logprobs"][old])
    for row in range(len(versions)):  # one switch a sample, from old to new
        v = versions[row][mask[row]]
        assert (v[1:] >= v[:-1]).all()
    new = (versions == 1) & mask
    assert new.sum() > 0 and not torch.equal(data.batch["rollout_logprobs"][new], plain.batch["rollout_logprobs"][new])
    if mode == "recompute":
        assert len(rows) > 10
        for j, i in enumerate(rows):
            assert (
                data.batch["responses"][i, switch[i] : switch[i] + 8].tolist() == fresh.batch["responses"][j].tolist()
            )


def token_prompts(prompts: list[list[int]]):
    """Prompts as token ids (left-padded input_ids and attention_mask), as the rollout takes them."""
    from meshrl.dataproto import DataProto

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return DataProto({"input_ids": ids, "attention_mask": mask})
