"""An environment server written in Node.js (examples/node-env): it answers as the bundled Python
calculator does, and multi-turn episodes play through it. Skipped where node/npm are absent."""

import json

import grpc
import pytest
from node_example import needs_node, start

from meshrl.config.rollout import RolloutConfig
from meshrl.errors import ServiceError
from meshrl.rpc import Client, Server
from meshrl.v1 import env_pb2
from services.env.calculator import Calculator
from services.rollout.servicer import RolloutServicer

SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"]

pytestmark = needs_node


@pytest.fixture(scope="module")
def node_env():
    proc, address = start("node-env")
    client = Client(address, SERVICE, timeout=60)
    client.wait_ready(30)
    yield client
    proc.terminate()
    proc.wait(10)


@pytest.mark.parametrize(
    "actions",
    [
        ["<calc>12*(3+4)-5</calc>", "so 79"],
        ["<calc>99*99</calc>", "<calc>1+</calc>", "9801"],
        ["I think 42"],
        ["<calc>123456789*987654321</calc>", "no idea"],
    ],
)
def test_node_answers_as_the_python_calculator(node_env, actions):
    truth = "79" if "12*" in actions[0] else "9801" if "99*99" in actions[0] else "42"
    py = Calculator()
    py.reset({"ground_truth": truth})
    episode = node_env.call("Reset", env_pb2.ResetRequest(task_json=json.dumps({"ground_truth": truth})))
    for action in actions:
        obs, reward, done, info = py.step(action)
        got = node_env.call("Step", env_pb2.StepRequest(episode_id=episode.episode_id, action=action))
        if obs.startswith("<result>error"):  # each names the problem in its own words
            assert got.observation.startswith("<result>error: ")
        else:
            assert got.observation == obs
        assert (got.reward, got.done) == (reward, done)
        if done:
            assert json.loads(got.info_json)["acc"] == info["acc"]


def test_node_refuses_what_the_contract_refuses(node_env):
    with pytest.raises(ServiceError) as e:
        node_env.call("Step", env_pb2.StepRequest(episode_id="nope", action="1"))
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ServiceError) as e:
        node_env.call("Reset", env_pb2.ResetRequest(task_json="[1]"))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert json.loads(node_env.call("Describe").details["stop"]) == ["</calc>"]


def test_episodes_play_through_the_node_environment(node_env, tiny_lm, arithmetic_data):
    from transformers import AutoTokenizer

    from orchestrator.config import load_config
    from orchestrator.data import PromptDataset
    from orchestrator.lifecycle.mesh import Mesh
    from orchestrator.sampling import multi_turn

    rollout = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=128))
    server = Server([rollout]).start()
    try:
        cfg = load_config(
            None, ["rollout.n=2", "rollout.multi_turn=true", "rollout.max_turns=2", "rollout.max_new_tokens=8"]
        )
        mesh = Mesh(cfg, {"rollout": Client(server.address, RolloutServicer.SERVICE, timeout=120), "env": node_env})
        mesh.env_stop = json.loads(node_env.call("Describe").details["stop"])
        tok = AutoTokenizer.from_pretrained(tiny_lm)
        prompts = PromptDataset(str(arithmetic_data["train"]), tok, 64).batch([0, 1, 2], ["a", "b", "c"])
        gen, scored, _ = multi_turn.sample(mesh, prompts, seed=3, tokenizer=tok)
        assert len(gen) == 6 and list(gen.non_tensor_batch["env_error"]) == [""] * 6
        assert all(1 <= t <= 2 for t in gen.non_tensor_batch["turns"])
        assert node_env.call("Describe").details["episodes_open"] == "0"  # done or closed, none left
    finally:
        server.stop(0)
        rollout.close()
