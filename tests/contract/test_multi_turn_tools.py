"""Multi-turn episodes in the model's own tool format (rollout.tool_parser=hermes) with a BPE model's
ChatML template, over a real rollout service and the real calculator environment service. The engine
behind the rollout service is scripted (it writes what a policy that calls the tool would), so that every
token of the trajectory can be checked: it is exactly the template's rendering of the conversation, the
policy's tokens kept as sampled, the template's text between turns masked out.
(The real engines run this format in tests/e2e/test_tool_template_learning.py.)"""

import json
import pathlib

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from meshrl.chat import turns
from meshrl.config.env import EnvConfig
from meshrl.config.rollout import RolloutConfig
from meshrl.rpc import Client, Server
from meshrl.tiny.arithmetic import CALCULATOR, conversation
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.vocab import model_vocab_size
from orchestrator.agents import episode
from orchestrator.config import load_config
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.sampling import agents, multi_turn
from services.env.servicer import EnvServicer
from services.rollout.servicer import RolloutServicer
from testkit.scripted import LOGPROB, SETTINGS, ScriptedEngine, batch

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG: list[str] = []  # the module's run config (the fixture fills in the model and data)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, arithmetic_data):
    small = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
    model = make_model(
        tmp_path_factory.mktemp("bpe") / "qwen2", TinyModelConfig(family="qwen2", tokenizer="bpe", **small)
    )
    tok = AutoTokenizer.from_pretrained(model)
    rollout = RolloutServicer(RolloutConfig(model=str(model), max_model_len=512), ScriptedEngine(tok))
    env = EnvServicer(EnvConfig(module="services.env.calculator:Calculator", processes=1))
    servers = [Server([rollout]).start(), Server([env]).start()]
    CONFIG[:] = [f"data.train_files={arithmetic_data['train']}", f"actor.model={model}", *SETTINGS]
    cfg = load_config(None, [*CONFIG, "rollout.multi_turn=true"])
    m = Mesh(
        cfg,
        {
            "rollout": Client(servers[0].address, RolloutServicer.SERVICE, timeout=60),
            "env": Client(servers[1].address, EnvServicer.SERVICE, timeout=60),
        },
    )
    m.env_tools = json.loads(m["env"].call("Describe").details["tools"])
    m.tokenizer = tok
    yield m
    for s in servers:
        s.stop(0)
    rollout.close()
    env.close()


def test_a_tool_episode_is_the_templates_conversation_token_by_token(mesh):
    """The trajectory of "12*7=" is what SFT would train on the same conversation: the same tokens, the
    assistant turns (with their <|im_end|>) trained, the template's text between them not."""
    tok = mesh.tokenizer
    data = batch(["12*7="], ["84"])
    data.batch["attention_mask"] = data.batch["input_ids"]
    gen, scored, _ = multi_turn.sample(mesh, data, seed=1, tokenizer=tok)
    pieces = turns(tok, conversation("12*7=", "12*7", "84", True), "row", [CALCULATOR])[:-1]  # up to the answer
    prompt = tok(pieces[0][0], add_special_tokens=False)["input_ids"]
    expected, mask = [], []
    for text, trained in pieces[1:]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        expected, mask = expected + ids, mask + [int(trained)] * len(ids)
    n = int(gen.batch["attention_mask"][0, gen.batch["prompts"].shape[1] :].sum())
    got = gen.batch["prompts"][0][gen.batch["prompts"][0] != tok.pad_token_id].tolist()
    assert got == prompt, (tok.decode(got), tok.decode(prompt))
    assert gen.batch["responses"][0, :n].tolist() == expected
    assert gen.batch["response_mask"][0, :n].tolist() == mask
    lp = gen.batch["rollout_logprobs"][0, :n]
    assert (lp[gen.batch["response_mask"][0, :n] == 1] == LOGPROB).all() and (
        lp[gen.batch["response_mask"][0, :n] == 0] == 0
    ).all()
    assert scored.scores.tolist() == [1.0] and gen.non_tensor_batch["tool_calls"].tolist() == [1]
    assert json.loads(gen.non_tensor_batch["turn_spans"][0]) and gen.non_tensor_batch["turns"].tolist() == [2]


def test_bad_calls_several_calls_and_a_cut_turn(mesh):
    tok = mesh.tokenizer
    data = batch(["3*3=", "5*5="], ["9", "25"])
    data.batch["attention_mask"] = data.batch["input_ids"]
    gen, scored, _ = multi_turn.sample(mesh, data, seed=2, tokenizer=tok)
    assert scored.scores.tolist() == [1.0, 1.0] and gen.non_tensor_batch["env_error"].tolist() == ["", ""]
    text = [tok.decode(gen.batch["responses"][i]) for i in range(2)]
    # the parser's error comes back as that call's result; two calls, two results in one user turn
    assert "<tool_response>\nerror: the tool call is not JSON" in text[0]
    assert "<tool_response>\n9\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>" in text[0]
    assert gen.non_tensor_batch["tool_calls"].tolist() == [2, 1]  # the environment counts the calls it made
    # a turn cut before its end token is closed by the template's text (masked), then the result follows
    spans = json.loads(gen.non_tensor_batch["turn_spans"][1])
    after = gen.batch["responses"][1, spans[0][1] :].tolist()
    assert after[0] == tok.eos_token_id and gen.batch["response_mask"][1, spans[0][1]] == 0
    assert tok.decode(after).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n25\n</tool_response>")


def test_a_turn_ended_at_the_other_end_token_is_not_closed_again(mesh):
    """<|endoftext|> ends a turn as <|im_end|> does (the model's generation config lists both, and both
    engines stop at either): the template's text follows it directly, no <|im_end|> is added as for a cut
    turn."""
    tok = mesh.tokenizer
    data = batch(["2*6="], ["12"])
    data.batch["attention_mask"] = data.batch["input_ids"]
    gen, scored, _ = multi_turn.sample(mesh, data, seed=3, tokenizer=tok)
    assert scored.scores.tolist() == [1.0]
    spans = json.loads(gen.non_tensor_batch["turn_spans"][0])
    first = gen.batch["responses"][0, : spans[0][1]].tolist()
    after = gen.batch["responses"][0, spans[0][1] :].tolist()
    assert tok.decode(first[-1:]) == "<|endoftext|>" and gen.batch["response_mask"][0, spans[0][1] - 1] == 1
    assert tok.decode(after).startswith("\n<|im_start|>user\n<tool_response>\n12\n</tool_response>")


def test_an_openai_agent_plays_the_same_episode_token_for_token(mesh):
    """The calculator written as an OpenAI-SDK agent (examples/agents/calculator.py, rollout.agent) against
    the run's endpoint records, token for token, the trajectory the environment service's path plays for
    the same tasks: the same prompt, response, mask, log-probs and score. Only the model's turns are
    trained; a turn cut before its end token and the other end token are handled as the env path does."""
    tok = mesh.tokenizer
    questions, truths = ["12*7=", "5*5=", "2*6="], ["84", "25", "12"]
    data = batch(questions, truths)
    data.batch["attention_mask"] = data.batch["input_ids"]
    data.non_tensor_batch["tools"] = np.array([json.dumps([CALCULATOR])] * 3, dtype=object)
    env_gen, env_scored, _ = multi_turn.sample(mesh, data, seed=4, tokenizer=tok)
    spec = f"{ROOT / 'examples/agents/calculator.py'}:agent"
    cfg = load_config(None, [*CONFIG, "rollout.multi_turn=false", f"rollout.agent={spec}", "rollout.agent_workers=2"])
    agent_mesh = Mesh(cfg, {"rollout": mesh["rollout"]})
    try:
        gen, scored, _ = agents.sample(agent_mesh, data, seed=4, tokenizer=tok)
    finally:
        episode.close_runners()
    for key in ("prompts", "responses", "response_mask", "rollout_logprobs", "attention_mask"):
        assert torch.equal(gen.batch[key], env_gen.batch[key]), key
    assert scored.scores.tolist() == env_scored.scores.tolist() == [1.0, 1.0, 1.0]
    assert gen.non_tensor_batch["turn_spans"].tolist() == env_gen.non_tensor_batch["turn_spans"].tolist()
    assert scored.metrics["agent/episodes_lost"] == 0 and scored.metrics["agent/calls/mean"] == 2
    assert scored.columns["acc"].tolist() == [True, True, True]


def test_one_agents_refused_call_stays_its_own(mesh):
    """Issue 58.1: episodes' calls meet in one Generate, so a call the rollout refuses (a prompt that leaves
    3 tokens of room, batched with turns of 64; a token id outside the vocabulary) failed every episode and
    the step. Now the long call is sent in a call of its own and answered, the bad id is a 400 naming the
    prompt to that agent alone, and the calculator episodes beside them score as always."""
    tok = mesh.tokenizer
    questions = ["12*7=", "long", "5*5=", "oov", "2*6="]
    data = batch(questions, ["84", "", "25", "", "12"])
    data.batch["attention_mask"] = data.batch["input_ids"]
    data.non_tensor_batch["tools"] = np.array([json.dumps([CALCULATOR])] * 5, dtype=object)
    vocab = model_vocab_size(mesh.cfg.actor.model)
    data.non_tensor_batch["extra_info"] = np.array([{"max_model_len": 512, "vocab_size": vocab}] * 5, dtype=object)
    spec = f"{ROOT / 'tests/contract/edge_agents.py'}:agent"
    over = [*CONFIG, "rollout.multi_turn=false", f"rollout.agent={spec}", "rollout.agent_workers=2"]
    cfg = load_config(None, [*over, "rollout.max_model_len=512", "rollout.concurrency=8"])
    agent_mesh = Mesh(cfg, {"rollout": mesh["rollout"]})
    try:
        gen, scored, _ = agents.sample(agent_mesh, data, seed=5, tokenizer=tok)
    finally:
        episode.close_runners()
    # 0.5: the long call answered with the 3 tokens of room; the bad id's episode recorded no call: lost
    assert scored.scores.tolist() == [1.0, 0.5, 1.0, 0.0, 1.0]
    assert scored.metrics["agent/episodes_lost"] == 1
