"""The environment service over a real gRPC server: the calculator's episodes, bad requests, and
environments that crash, hang, kill their process or answer nonsense (the service survives each; the
episode ends, and a hung or dead worker process is replaced)."""

import json
import pathlib
import threading
import time

import grpc
import pytest
from calls import expect

from meshrl.config.env import EnvConfig
from meshrl.errors import ServiceError
from meshrl.rpc import Client, Server
from meshrl.v1 import env_pb2
from orchestrator.lifecycle.services import launch
from services.env.servicer import EnvServicer

SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"]
SCRIPTED = f"{pathlib.Path(__file__).with_name('env_scripted.py')}:Scripted"  # loaded in the worker processes
GRACE = 5.0  # seconds a stopping server gives calls in flight (meshrl.rpc.server.run_until_signal)


def serve(**cfg):
    servicer = EnvServicer(EnvConfig(**cfg))
    server = Server([servicer]).start()
    return servicer, server, Client(server.address, SERVICE, timeout=60, retries=0)


@pytest.fixture(scope="module")
def scripted():
    servicer, server, client = serve(module=SCRIPTED, step_timeout=1.0, max_episodes=8, max_action_chars=100)
    yield client
    server.stop(0)
    servicer.close()


def reset(client, task=None, **kw):
    return client.call("Reset", env_pb2.ResetRequest(task_json=json.dumps(task or {}), **kw))


def step(client, episode, action):
    return client.call("Step", env_pb2.StepRequest(episode_id=episode, action=action))


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


def test_tool_calls_in_the_models_own_format():
    """Describe lists the calculator's tool schema; a Step's parsed calls are answered one result each, in
    order, in its worker process; the final answer is scored as in the text protocol."""
    from meshrl.tiny.arithmetic import CALCULATOR

    servicer, server, client = serve(module="services.env.calculator:Calculator")
    try:
        assert json.loads(client.call("Describe").details["tools"]) == [CALCULATOR]
        episode = reset(client, {"ground_truth": "84"}).episode_id
        calls = [{"name": "calculator", "arguments": {"expression": "12*7"}}, {"name": "calculator", "arguments": {}}]
        reply = client.call(
            "Step", env_pb2.StepRequest(episode_id=episode, action="<tool_call>...", tool_calls_json=json.dumps(calls))
        )
        assert reply.tool_results[0] == "84" and reply.tool_results[1].startswith("error: the tool is calculator")
        assert not reply.done and reply.reward == 0.0 and reply.observation == ""
        for bad, match in [("[1", "not JSON"), ('[{"name": "calculator", "arguments": "12*7"}]', "list of")]:
            expect(
                grpc.StatusCode.INVALID_ARGUMENT,
                lambda bad=bad: client.call(
                    "Step", env_pb2.StepRequest(episode_id=episode, action="", tool_calls_json=bad)
                ),
                match,
            )
        done = step(client, episode, "84")
        assert done.done and done.reward == 1.0 and json.loads(done.info_json)["tool_calls"] == 2
    finally:
        server.stop(0)
        servicer.close()


def test_tool_calls_to_an_environment_without_tools_end_the_episode(scripted):
    episode = reset(scripted, {"ground_truth": "1"}).episode_id
    calls = json.dumps([{"name": "x", "arguments": {}}])
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: scripted.call("Step", env_pb2.StepRequest(episode_id=episode, action="", tool_calls_json=calls)),
        "takes no tool calls",
    )
    expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: step(scripted, episode, "1"), "no episode")


def test_reset_passes_the_task_and_seed(scripted):
    r = reset(scripted, {"n": 3}, seed=2**64 - 1)
    assert r.observation == f"task 3 seed {2**64 - 1}" and json.loads(r.info_json) == {"ready": True}
    assert json.loads(scripted.call("Describe").details["stop"]) == ["</tool>"]
    ok = step(scripted, r.episode_id, "hello")
    assert (ok.observation, ok.reward, ok.done) == ("echo hello", 0.5, False) and json.loads(ok.info_json) == {"len": 5}
    assert scripted.call("Close", env_pb2.CloseRequest(episode_id=r.episode_id)).closed


@pytest.mark.parametrize(
    "task_json, match",
    [
        ("{not json", "task_json is not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "task_json is nested too deeply"),  # once INTERNAL
    ],
)
def test_bad_tasks(scripted, task_json, match):
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: scripted.call("Reset", env_pb2.ResetRequest(task_json=task_json)),
        match,
    )


@pytest.mark.parametrize(
    "action, code, match",
    [
        ("crash", grpc.StatusCode.ABORTED, "failed in step: RuntimeError: the tool fell over"),
        ("refuse", grpc.StatusCode.INVALID_ARGUMENT, "refused this in step: no such tool"),
        ("hang", grpc.StatusCode.ABORTED, "took longer than --step-timeout 1 s"),
        ("bad-type", grpc.StatusCode.ABORTED, "returned a int observation"),
        ("bad-reward", grpc.StatusCode.ABORTED, "returned reward nan"),
        ("short", grpc.StatusCode.ABORTED, "must return (observation, reward, done, info)"),
        ("x" * 101, grpc.StatusCode.INVALID_ARGUMENT, "exceeds --max-action-chars 100"),
    ],
)
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
    servicer, server, client = serve(module=SCRIPTED, max_episodes=2, idle_timeout=0.3)
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
    env_file.write_text(
        "class Echo:\n    def reset(self, task, seed=None):\n        return 'hi'\n"
        "    def step(self, action):\n        return action.upper(), 1.0, True, {}\n"
    )
    proc, address = launch(["env", "--module", f"{env_file}:Echo"])
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
        EnvServicer(EnvConfig(module="services.env.calculator:Nope"))
    with pytest.raises(ValueError, match="must look like"):
        EnvConfig(module="no_colon")


def test_hung_steps_are_stopped_and_later_episodes_run():
    """--workers 2 and 3 steps that never return: each ends at --step-timeout, and the service still
    serves (a hung step once kept its thread: two made every later Reset ABORTED)."""
    servicer, server, client = serve(module=SCRIPTED, workers=2, step_timeout=1.0)
    try:
        for _ in range(3):
            r = reset(client)
            expect(
                grpc.StatusCode.ABORTED,
                lambda: step(client, r.episode_id, "forever"),  # noqa: B023 - called at once, in the loop
                "took longer than --step-timeout 1 s",
            )
        r = reset(client, {"n": 1})
        assert r.observation == "task 1 seed None" and step(client, r.episode_id, "done").done
        assert client.health(SERVICE.full_name) == "SERVING"
        assert client.call("Describe").details["workers_replaced"] == "3"
    finally:
        server.stop(0)
        servicer.close()


def test_episodes_of_a_replaced_worker_are_lost_with_a_clear_status():
    servicer, server, client = serve(module=SCRIPTED, processes=1, step_timeout=1.0)
    try:
        hung, beside = reset(client), reset(client)  # one worker process: both live in it
        expect(grpc.StatusCode.ABORTED, lambda: step(client, hung.episode_id, "forever"), "--step-timeout")
        expect(
            grpc.StatusCode.ABORTED,
            lambda: step(client, beside.episode_id, "hi"),
            "episode lost: its worker was replaced after a hung step",
        )
        expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: step(client, beside.episode_id, "hi"), "no episode")
        fresh = reset(client)
        assert step(client, fresh.episode_id, "hi").observation == "echo hi"
    finally:
        server.stop(0)
        servicer.close()


def test_a_tool_that_kills_its_process_ends_only_its_episode(scripted):
    r = reset(scripted)
    expect(grpc.StatusCode.ABORTED, lambda: step(scripted, r.episode_id, "exit"), "worker process died")
    other = reset(scripted)
    assert step(scripted, other.episode_id, "done").done


def test_health_is_not_serving_while_no_worker_can_start(monkeypatch):
    servicer, server, client = serve(module=SCRIPTED, workers=1, step_timeout=1.0)
    try:
        assert client.health(SERVICE.full_name) == "SERVING"
        monkeypatch.setenv("MESHRL_TEST_ENV_BROKEN", "1")  # the replacement worker cannot load the environment
        r = reset(client)
        expect(grpc.StatusCode.ABORTED, lambda: step(client, r.episode_id, "forever"), "--step-timeout")
        wait_for(lambda: client.health(SERVICE.full_name) == "NOT_SERVING", 20)
        expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: reset(client), "broken on purpose")
        monkeypatch.delenv("MESHRL_TEST_ENV_BROKEN")  # it retries, and serves again once one starts
        wait_for(lambda: client.health(SERVICE.full_name) == "SERVING", 30)
        assert step(client, reset(client).episode_id, "done").done
    finally:
        server.stop(0)
        servicer.close()


def test_sigterm_with_hung_steps_ends_within_the_grace():
    proc, address = launch(["env", "--module", SCRIPTED, "--workers", "2", "--step-timeout", "300"])
    client = Client(address, SERVICE, timeout=120, retries=0)
    errors = []

    def hang():
        try:
            step(client, reset(client).episode_id, "forever")
        except ServiceError as e:
            errors.append(e.code)

    threads = [threading.Thread(target=hang) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: client.call("Describe").details["episodes_open"] == "2", 20)
        time.sleep(0.5)  # both steps are in the environment now
        start = time.monotonic()
        proc.terminate()
        assert proc.wait(GRACE + 25) == 0
        assert time.monotonic() - start < GRACE + 5
        for t in threads:
            t.join(10)
        assert len(errors) == 2  # the hung calls ended too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)
