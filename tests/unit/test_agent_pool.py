"""Where agents run (orchestrator/agents/pool.py), with real worker processes and commands: an episode
that crashes, hangs, raises or prints garbage is lost with the reason said, and the next one plays."""

import concurrent.futures
import os
import time

import pytest

from orchestrator.agents.pool import AgentPool, CommandAgent

AGENTS = """
import os, sys, time

def good(task, base_url, api_key):
    return {"reward": task["x"] * 2, "key": api_key, "url": base_url}

def crash(task, base_url, api_key):
    os._exit(3)

def hang(task, base_url, api_key):
    time.sleep(600 if task.get("hang") else 6 if task.get("slow") else 0)
    return 1.0

def raises(task, base_url, api_key):
    raise RuntimeError("the tool is down")

def odd(task, base_url, api_key):
    print("chatter on stdout")  # goes to stderr, never into the frames
    return object()
"""


@pytest.fixture
def agents(tmp_path):
    path = tmp_path / "agents.py"
    path.write_text(AGENTS)
    return str(path)


def test_a_pool_loses_only_the_bad_episodes(agents):
    pool = AgentPool(f"{agents}:good", workers=1, threads=2, timeout=30)
    try:
        assert pool.play({"x": 2}, "http://u/v1", "k1") == ({"reward": 4, "key": "k1", "url": "http://u/v1"}, "")
        assert pool.play({"x": 3}, "http://u/v1", "k2")[0]["reward"] == 6  # the same worker, again
    finally:
        pool.close()
    for name, why in [
        ("crash", "died (exit code 3)"),
        ("raises", "raised RuntimeError: the tool is down"),
        ("odd", "raised TypeError"),
    ]:
        pool = AgentPool(f"{agents}:{name}", workers=1, threads=1, timeout=30)
        try:
            result, error = pool.play({"x": 1}, "u", "k")
            assert result is None and why in error, error
        finally:
            pool.close()


def test_a_hung_agent_is_killed_at_its_timeout_and_replaced(agents):
    """Episodes share a worker on threads; one that hangs stops the worker, losing the one beside it (said
    so), and the next episode gets a fresh worker."""
    pool = AgentPool(f"{agents}:hang", workers=1, threads=2, timeout=3)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as threads:
            hung = threads.submit(pool.play, {"hang": True}, "u", "k1")
            time.sleep(0.5)
            beside = threads.submit(pool.play, {"slow": True}, "u", "k2")
            (result, error), (other, why) = hung.result(), beside.result()
        assert result is None and "agent_timeout=3" in error
        assert other is None and "lost with its worker" in why
        first = pool.slots[0]
        assert pool.play({}, "u", "k3") == (1.0, "") and pool.slots[0] is not first
    finally:
        pool.close()


def test_an_agent_that_cannot_load_is_said_before_any_episode(agents, tmp_path):
    pool = AgentPool(f"{agents}:missing", workers=1, threads=1, timeout=5)
    with pytest.raises(ValueError, match="missing"):
        pool.play({}, "u", "k")
    pool.close()


def test_a_command_gets_the_endpoint_and_the_task_and_prints_its_result(tmp_path):
    agent = CommandAgent(
        'python3 -c "import json,os,sys; t=json.load(sys.stdin); '
        "print('log line'); print(json.dumps({'reward': t['x'], 'url': os.environ['OPENAI_BASE_URL'], "
        "'key': os.environ['OPENAI_API_KEY']}))\"",
        timeout=30,
    )
    assert agent.play({"x": 0.5}, "http://h/v1", "sk-1") == ({"reward": 0.5, "url": "http://h/v1", "key": "sk-1"}, "")
    assert "not JSON" in CommandAgent("echo hello", 30).play({}, "u", "k")[1]
    assert "exited with 2" in CommandAgent("echo oops >&2; exit 2", 30).play({}, "u", "k")[1]
    marker = tmp_path / "still-running"
    slow = CommandAgent(f"(sleep 3; touch {marker}) & sleep 600", timeout=1)
    assert "agent_timeout=1" in slow.play({}, "u", "k")[1]
    time.sleep(3.5)
    assert not os.path.exists(marker)  # what the command started was killed with it


def test_closing_the_pool_ends_the_episodes_in_flight_at_once(agents):
    """A run that stops (Ctrl-C) does not wait out its agents' episodes: they end lost, their workers killed."""
    pool = AgentPool(f"{agents}:hang", workers=1, threads=2, timeout=600)
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        hung = threads.submit(pool.play, {"hang": True}, "u", "k")
        deadline = time.monotonic() + 60
        while not (pool.slots[0] and pool.slots[0].load) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = pool.slots[0]
        pool.close()
        result, error = hung.result(timeout=30)
    assert result is None and "the run is stopping" in error
    assert worker.child.proc.wait(10) is not None


GROUPED = """
import os

KEPT = {}  # what each episode left for its group's scoring, in this worker's memory

def agent(task, base_url, api_key):
    KEPT[api_key] = (task["x"], os.getpid())
    return {"reward": 0.0}

def score_group(keys, tasks, results):
    if any(t["x"] < 0 for t in tasks):
        raise RuntimeError("cannot rank that")
    kept = [KEPT.pop(k) for k, r in zip(keys, results) if r is not None]
    if len({pid for _, pid in kept}) != 1:
        raise RuntimeError("the group was played on more than one worker")
    best = max(x for x, _ in kept)
    rank = lambda t: {"reward": float(t["x"] == best), "group_size": len(kept)}
    return [None if r is None else rank(t) for t, r in zip(tasks, results)]
"""


def test_a_group_plays_on_one_worker_and_is_scored_there_together(tmp_path, agents):
    """An agent module with score_group: every episode of a group goes to the same worker (the episodes'
    memory is there), and the group's scores come back in its order; a lost episode is None to it."""
    path = tmp_path / "grouped.py"
    path.write_text(GROUPED)
    pool = AgentPool(f"{path}:agent", workers=2, threads=2, timeout=30)
    try:
        assert pool.scores_groups()
        tasks = {g: [{"x": x} for x in (3, 7, 5)] for g in (0, 1)}
        with concurrent.futures.ThreadPoolExecutor(6) as threads:
            for g in (0, 1):
                plays = [threads.submit(pool.play, t, "u", f"k{g}{i}", group=g) for i, t in enumerate(tasks[g])]
                assert [p.result() for p in plays] == [({"reward": 0.0}, "")] * 3
        scores, error = pool.score_group(0, ["k00", "k01", "k02"], tasks[0], [{}, {}, {}])
        assert error == "" and [s["reward"] for s in scores] == [0.0, 1.0, 0.0]
        scores, error = pool.score_group(1, ["k10", "k11", "k12"], tasks[1], [{}, None, {}])  # k11 was lost
        assert error == "" and scores[1] is None and [scores[0]["reward"], scores[2]["reward"]] == [0.0, 1.0]
        failed, why = pool.score_group(0, ["k0"], [{"x": -1}], [{}])
        assert failed is None and "cannot rank that" in why  # its failure is the group's
    finally:
        pool.close()
    plain = AgentPool(f"{agents}:good", workers=1, threads=1, timeout=30)
    try:
        assert not plain.scores_groups()  # its episodes' own rewards stand
    finally:
        plain.close()
