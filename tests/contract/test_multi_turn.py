"""Multi-turn rollouts (orchestrator.sampling.multi_turn) over a real HF rollout service and a real environment
service with a scripted environment: masks, log-probs and turn boundaries checked token by token."""

import json
import pathlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from meshrl.config.env import EnvConfig
from meshrl.config.rollout import RolloutConfig
from meshrl.rpc import Client, Server
from orchestrator.config import load_config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.sampling import multi_turn
from services.env.servicer import EnvServicer
from services.rollout.servicer import RolloutServicer

TURNS = f"{pathlib.Path(__file__).with_name('env_scripted.py')}:Turns"  # loaded in the env's worker processes


@pytest.fixture(scope="module")
def mesh(tiny_lm, arithmetic_data):
    rollout = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=128))
    env = EnvServicer(EnvConfig(module=TURNS, step_timeout=10))
    servers = [Server([rollout]).start(), Server([env]).start()]
    cfg = load_config(
        None,
        [
            f"data.train_files={arithmetic_data['train']}",
            f"actor.model={tiny_lm}",
            "rollout.n=2",
            "rollout.max_new_tokens=5",
            "rollout.multi_turn=true",
            "rollout.max_turns=4",
            "rollout.max_response_tokens=60",
            "rollout.concurrency=8",
        ],
    )
    m = Mesh(
        cfg,
        {
            "rollout": Client(servers[0].address, RolloutServicer.SERVICE, timeout=120),
            "env": Client(servers[1].address, EnvServicer.SERVICE, timeout=120),
        },
    )
    m.tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    yield m
    for s in servers:
        s.stop(0)
    rollout.close()
    env.close()


def prompts(mesh, rows: int, truths=None):
    data = PromptDataset(mesh.cfg.data.train_files, mesh.tokenizer, 64).batch(
        list(range(rows)), [f"u{i}" for i in range(rows)]
    )
    if truths is not None:
        data.non_tensor_batch["reward_model"] = [{"ground_truth": t} for t in truths]
    return data


def test_trajectories_token_by_token(mesh, tiny_lm):
    gen, scored, seconds = multi_turn.sample(mesh, prompts(mesh, 3), seed=5, tokenizer=mesh.tokenizer)
    tok = mesh.tokenizer
    assert len(gen) == 6 and set(seconds) == {"timing_s/gen", "timing_s/reward"}
    assert list(gen.non_tensor_batch["uid"]) == ["u0", "u0", "u1", "u1", "u2", "u2"]
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    P = gen.batch["prompts"].shape[1]
    for i in range(6):
        spans = json.loads(gen.non_tensor_batch["turn_spans"][i])
        assert len(spans) == gen.non_tensor_batch["turns"][i] == 3  # done after the third turn
        response = gen.batch["responses"][i]
        mask, lp = gen.batch["response_mask"][i], gen.batch["rollout_logprobs"][i]
        length = int(gen.batch["attention_mask"][i, P:].sum())
        policy = torch.zeros(length)
        for a, b in spans:
            policy[a:b] = 1
        assert torch.equal(mask[:length], policy) and mask[length:].sum() == 0
        assert (
            (lp[:length][policy == 1] < 0).all() and (lp[:length][policy == 0] == 0).all() and (lp[length:] == 0).all()
        )
        # between the turns, exactly the tokens of the observations; before the first, the reset's
        first = "start" if i // 2 % 2 else ""
        observations = [first, " result 1", " result 2"]
        starts = [0] + [b for _, b in spans[:-1]]
        for (a, _), start, text in zip(spans, starts, observations):
            expected = tok(text, add_special_tokens=False)["input_ids"] if text else []
            assert response[start:a].tolist() == expected
        # each policy token's log-prob is the model's, given everything before it (observations included)
        ids = gen.batch["input_ids"][i : i + 1]
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=gen.batch["attention_mask"][i : i + 1],
                position_ids=gen.batch["position_ids"][i : i + 1],
            ).logits[0, P - 1 : -1]
        ref = torch.log_softmax(logits.float(), -1).gather(-1, response[:, None]).squeeze(-1)
        assert torch.allclose(ref[:length][policy == 1], lp[:length][policy == 1], atol=1e-4)
    assert torch.allclose(scored.scores, torch.full((6,), 0.75))
    last = [json.loads(s)[-1][1] - 1 for s in gen.non_tensor_batch["turn_spans"]]
    assert all(scored.token_level_scores[i, last[i]] == 0.75 for i in range(6))
    assert scored.metrics["multi_turn/turns/mean"] == 3 and scored.metrics["multi_turn/done_frac"] == 1
    assert gen.meta_info["weight_version"] == 0 and list(gen.non_tensor_batch["finish_reason"]) == ["stop"] * 6


def test_limits_and_a_failing_environment_end_only_their_trajectory(mesh):
    mesh.cfg.rollout.max_turns = 2  # the scripted episode needs 3: cut at 2, its episode closed
    try:
        gen, scored, _ = multi_turn.sample(
            mesh, prompts(mesh, 2, truths=["7", "crash"]), seed=1, tokenizer=mesh.tokenizer
        )
    finally:
        mesh.cfg.rollout.max_turns = 4
    errors = list(gen.non_tensor_batch["env_error"])
    assert errors[:2] == ["", ""] and all("Step: ABORTED: the environment failed in step" in e for e in errors[2:])
    assert list(gen.non_tensor_batch["turns"]) == [2, 2, 2, 2]  # the crash came at the second Step
    assert list(gen.non_tensor_batch["finish_reason"]) == ["length"] * 4
    assert scored.scores.tolist() == [0.5, 0.5, 0.0, 0.0]  # env.error_score for the failed ones
    assert scored.metrics["multi_turn/num_env_failed"] == 2
    assert mesh["env"].call("Describe").details["episodes_open"] == "0"  # none left behind
