"""The environment service over a real gRPC server: the calculator's episodes, bad requests, and
environments that crash, hang or answer nonsense (the service survives each; the episode ends)."""

import json
import time

import grpc
import pytest

from meshrl.errors import ServiceError
from meshrl.rpc import Client, Server
from meshrl.v1 import env_pb2
from orchestrator.services import launch
from services.env.config import EnvConfig
from services.env.servicer import EnvServicer

SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"]


class Scripted:
    """Does what the action says: crash, refuse, hang, or answer with a wrong type."""

    def reset(self, task, seed=None):
        return f"task {task.get('n', 0)} seed {seed}", {"ready": True}

    def step(self, action):
        if action == "crash":
            raise RuntimeError("the tool fell over")
        if action == "refuse":
            raise ValueError("no such tool")
        if action == "hang":
            time.sleep(5)
        if action == "bad-type":
            return 42, 0.0, False, {}
        if action == "bad-reward":
            return "x", float("nan"), False, {}
        if action == "short":
            return "x", 0.0
        return f"echo {action}", 0.5, action == "done", {"len": len(action)}


def serve(factory=None, **cfg):
    servicer = EnvServicer(EnvConfig(**cfg), factory)
    server = Server([servicer]).start()
    return servicer, server, Client(server.address, SERVICE, timeout=60, retries=0)


@pytest.fixture(scope="module")
def scripted():
    servicer, server, client = serve(Scripted, step_timeout=1.0, max_episodes=8, max_action_chars=100)
    yield client
    server.stop(0)
    servicer.close()


def reset(client, task=None, **kw):
    return client.call("Reset", env_pb2.ResetRequest(task_json=json.dumps(task or {}), **kw))


def step(client, episode, action):
    return client.call("Step", env_pb2.StepRequest(episode_id=episode, action=action))


def expect(code, fn, match):
    with pytest.raises(ServiceError) as e:
        fn()
    assert e.value.code == code and match in e.value.details, e.value


def test_a_calculator_episode():
    servicer, server, client = serve()
    try:
        first = reset(client, {"data_source": "arithmetic", "ground_truth": "1234"})
        assert first.observation == "" and not first.done
        called = step(client, first.episode_id, "I will compute <calc>12*100+34</calc>")
        assert (called.observation, called.reward, called.done) == ("<result>1234</result>", 0.0, False)
        assert json.loads(called.info_json) == {"tool": "calc", "result": "1234"}
        wrong = step(client, first.episode_id, "<calc>2**10</calc>")
        assert wrong.observation.startswith("<result>error: only integers") and not wrong.done
        done = step(client, first.episode_id, "The answer is 1234")
        assert done.done and done.reward == 1.0 and done.observation == ""
        assert json.loads(done.info_json) == {"acc": True, "pred": "1234", "tool_calls": 2, "tool_errors": 1}
        expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: step(client, first.episode_id, "again"), "no episode")
        assert not client.call("Close", env_pb2.CloseRequest(episode_id=first.episode_id)).closed
        other = reset(client, {"reward_model": {"ground_truth": "7"}})  # verl's column works too
        assert step(client, other.episode_id, "8").reward == 0.0
        info = client.call("Describe")
        assert info.service == "env" and info.details["episodes_open"] == "0"
        assert info.details["episodes_started"] == "2"
    finally:
        server.stop(0)
        servicer.close()


def test_reset_passes_the_task_and_seed(scripted):
    r = reset(scripted, {"n": 3}, seed=9)
    assert r.observation == "task 3 seed 9" and json.loads(r.info_json) == {"ready": True}
    ok = step(scripted, r.episode_id, "hello")
    assert (ok.observation, ok.reward, ok.done) == ("echo hello", 0.5, False) and json.loads(ok.info_json) == {"len": 5}
    assert scripted.call("Close", env_pb2.CloseRequest(episode_id=r.episode_id)).closed


@pytest.mark.parametrize("task_json, match", [("{not json", "task_json is not JSON"),
                                              ("[1, 2]", "must be a JSON object")])
def test_bad_tasks(scripted, task_json, match):
    expect(grpc.StatusCode.INVALID_ARGUMENT,
           lambda: scripted.call("Reset", env_pb2.ResetRequest(task_json=task_json)), match)


@pytest.mark.parametrize("action, code, match", [
    ("crash", grpc.StatusCode.ABORTED, "failed in step: RuntimeError: the tool fell over"),
    ("refuse", grpc.StatusCode.INVALID_ARGUMENT, "refused this in step: no such tool"),
    ("hang", grpc.StatusCode.ABORTED, "took longer than --step-timeout 1 s"),
    ("bad-type", grpc.StatusCode.ABORTED, "returned a int observation"),
    ("bad-reward", grpc.StatusCode.ABORTED, "returned reward nan"),
    ("short", grpc.StatusCode.ABORTED, "must return (observation, reward, done, info)"),
    ("x" * 101, grpc.StatusCode.INVALID_ARGUMENT, "exceeds --max-action-chars 100"),
])
def test_a_failing_step_ends_its_episode_and_the_service_goes_on(scripted, action, code, match):
    r = reset(scripted)
    expect(code, lambda: step(scripted, r.episode_id, action), match)
    if len(action) <= 100:  # the episode is over; a refused action's is not
        expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: step(scripted, r.episode_id, "hello"), "no episode")
    else:
        scripted.call("Close", env_pb2.CloseRequest(episode_id=r.episode_id))
    other = reset(scripted)
    assert step(scripted, other.episode_id, "done").done


def test_episode_limit_and_idle_episodes():
    servicer, server, client = serve(Scripted, max_episodes=2, idle_timeout=0.3)
    try:
        a, b = reset(client), reset(client)
        expect(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: reset(client), "2 episodes are open")
        client.call("Close", env_pb2.CloseRequest(episode_id=a.episode_id))
        reset(client)
        time.sleep(0.5)  # both now idle past the limit: the next Reset frees them
        reset(client)
        expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: step(client, b.episode_id, "hi"), "sat idle")
        assert client.call("Describe").details["episodes_open"] == "1"
    finally:
        server.stop(0)
        servicer.close()


def test_meshrl_serve_env_hosts_a_file_of_the_users(tmp_path):
    env_file = tmp_path / "my_env.py"
    env_file.write_text("class Echo:\n    def reset(self, task, seed=None):\n        return 'hi'\n"
                        "    def step(self, action):\n        return action.upper(), 1.0, True, {}\n")
    proc, address = launch(["env", "--env", f"{env_file}:Echo"])
    try:
        with Client(address, SERVICE, timeout=60) as client:
            r = reset(client)
            assert r.observation == "hi"
            assert step(client, r.episode_id, "abc").observation == "ABC"
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


def test_a_bad_env_spec_is_named():
    with pytest.raises(ValueError, match="cannot be loaded"):
        EnvServicer(EnvConfig(env="services.env.calculator:Nope"))
    with pytest.raises(ValueError, match="must look like"):
        EnvConfig(env="no_colon")
