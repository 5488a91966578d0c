"""Episodes per second of one trivial agent (one chat call, its reply checked: testkit/agent_endpoint.py's
AGENT) played through a real endpoint whose engine answers at once, so that what is measured is where
the agent runs (issue 58 item 5), on this machine.

    .venv/bin/python bench/agent_python_bench.py [EPISODES] [CONCURRENCY]

Two pairs, each EPISODES episodes CONCURRENCY at a time after one untimed round (the workers start),
each pair one interpreter and one agent played by 2 long-lived workers (rollout.agent) against a process
per episode (rollout.agent_command):
  - rollout.agent_python naming an interpreter without meshrl (this one with -I -S: no site-packages,
    so the agent speaks urllib): what an interpreter's start costs an episode;
  - meshrl's interpreter, where the agent imports and uses the `openai` client: what an import costs
    each process as well, as an agent framework's venv would import its framework.
"""

import concurrent.futures
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.agents.command import CommandAgent  # noqa: E402
from orchestrator.agents.pool import AgentPool  # noqa: E402
from testkit.agent_endpoint import endpoint, write_agent  # noqa: E402

PROMPT = [{"role": "user", "content": "2+2="}]
WORKERS = 2


def rate(gateway, runner, episodes: int, concurrency: int) -> float:
    """Episodes per second; every one must score 1."""

    def one(_) -> float:
        session = gateway.open()
        try:
            result, error = runner.play({"prompt": PROMPT}, gateway.base_url, session.key)
        finally:
            gateway.close(session.key)
        assert error == "" and result["reward"] == 1.0, (result, error)
        return result["reward"]

    with concurrent.futures.ThreadPoolExecutor(concurrency) as threads:
        list(threads.map(one, range(concurrency)))  # untimed: workers start, caches warm
        start = time.perf_counter()
        list(threads.map(one, range(episodes)))
        return episodes / (time.perf_counter() - start)


def main(episodes: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        bare = folder / "python"
        bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
        bare.chmod(0o755)
        agent = write_agent(folder)
        threads = -(-concurrency // WORKERS)
        # in pairs: one interpreter and one agent, a worker's many episodes against a process each
        runners: list[tuple[str, str, AgentPool | CommandAgent]] = [
            (
                "no meshrl (-I -S), urllib",
                "rollout.agent",
                AgentPool(f"{agent}:agent", WORKERS, threads, 60, python=str(bare)),
            ),
            ("no meshrl (-I -S), urllib", "rollout.agent_command", CommandAgent(f"{bare} {agent}", 60)),
            ("meshrl's python, openai client", "rollout.agent", AgentPool(f"{agent}:agent", WORKERS, threads, 60)),
            ("meshrl's python, openai client", "rollout.agent_command", CommandAgent(f"{sys.executable} {agent}", 60)),
        ]
        gateway = endpoint(folder / "model")
        try:
            for python, key, runner in runners:
                print(
                    f"{python:32s} {key:22s} {rate(gateway, runner, episodes, concurrency):8.1f} episodes/s", flush=True
                )
        finally:
            for _, _, runner in runners:
                runner.close()
            gateway.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, int(sys.argv[2]) if len(sys.argv) > 2 else 8)
