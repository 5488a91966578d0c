"""rollout.agent_command (orchestrator/agents/command.py) with real commands: the timeout holds against a
child that keeps the output open, output is never held whole, and a command that cannot start stops the
run (ValueError) rather than losing every episode."""

import os
import signal
import stat
import threading
import time

import pytest

from orchestrator.agents import command
from orchestrator.agents.command import CommandAgent, LastLine, Tail


@pytest.fixture
def pidfile(tmp_path):
    """A file a test's command writes a leftover's pid to; the leftover is killed after the test."""
    path = tmp_path / "leftover.pid"
    yield path
    if path.exists() and path.read_text().strip():
        try:
            os.kill(int(path.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(params=["pidfd", "polling"])
def exits(request, monkeypatch):
    """The command's exit seen through a pidfd, or (a system without) by polling."""
    if request.param == "polling":
        monkeypatch.delattr(os, "pidfd_open", raising=False)


def escaped(pidfile) -> str:
    """`setsid` a sleep that leaves the command's session holding its stdout and stderr, its pid in `pidfile`."""
    return f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 1000' &"


def test_last_line_keeps_only_the_last_non_blank_line_in_any_chunking():
    text = b'junk 1\n\n{"reward": 0.5, "a": "x y"}\n  \n'
    for size in (1, 2, 3, 7, len(text)):
        line = LastLine()
        for i in range(0, len(text), size):
            line.feed(text[i : i + size])
        assert line.result() == ('{"reward": 0.5, "a": "x y"}', False), size
    line = LastLine()
    line.feed(b"first\nno newline at the end")
    assert line.result() == ("no newline at the end", False)
    assert LastLine().result() == ("", False)


def test_last_line_and_tail_stay_bounded():
    line = LastLine(limit=100)
    for _ in range(1000):
        line.feed(b"x" * 999 + b"\n" + b"y" * 500)  # long lines, each split across chunks
        assert len(line.open) <= 100 and len(line.line) <= 100
    line.feed(b"\n" + b"z" * 300)
    assert line.result() == ("z" * 100, True)  # cut: not taken for a result
    assert line.num_bytes == 1000 * 1500 + 301
    tail = Tail(limit=10)
    for i in range(100):
        tail.feed(b"line %d\n" % i)
        assert len(tail.data) <= 10
    assert tail.last_line() == "line 99"
    tail.feed(b"a" * 50)
    assert bytes(tail.data) == b"a" * 10


def test_a_command_with_megabytes_of_output_gives_its_result_holding_a_bounded_tail(monkeypatch):
    """50 MB of junk on stdout and 5 MB on stderr before the result line: the result, read in chunks."""
    held: dict[str, int] = {"stdout": 0, "stderr": 0}

    class WatchedLine(LastLine):
        def feed(self, chunk):
            super().feed(chunk)
            held["stdout"] = max(held["stdout"], len(self.open) + len(self.line))
            held["read"] = self.num_bytes

    class WatchedTail(Tail):
        def feed(self, chunk):
            super().feed(chunk)
            held["stderr"] = max(held["stderr"], len(self.data))

    monkeypatch.setattr(command, "LastLine", WatchedLine)
    monkeypatch.setattr(command, "Tail", WatchedTail)
    agent = CommandAgent(
        "yes 'junk line' | head -c 50000000; yes 'err' | head -c 5000000 >&2; echo '{\"reward\": 0.25}'", 120
    )
    assert agent.play({}, "u", "k") == ({"reward": 0.25}, "")
    assert held["read"] == 50_000_000 + len('{"reward": 0.25}\n')
    assert held["stdout"] < 100 and 0 < held["stderr"] <= command.TAIL_BYTES  # the junk was never held whole
    noisy = CommandAgent("yes 'err' | head -c 5000000 >&2; echo 'the tool is down' >&2; exit 3", 120)
    assert noisy.play({}, "u", "k") == (None, "the agent command exited with 3: the tool is down")


def test_a_large_task_reaches_the_command_on_stdin_whether_or_not_it_reads_it():
    task = {"x": "t" * 100_000}  # more than a pipe holds: written as the command reads
    reader = CommandAgent("python3 -c \"import json,sys; print(len(json.load(sys.stdin)['x']))\"", 60)
    assert reader.play(task, "u", "k") == (100_000, "")
    assert CommandAgent("echo 2", 60).play(task, "u", "k") == (2, "")
    result, error = CommandAgent("echo 3", 60).play({"x": "t" * 300_000}, "u", "k")  # MESHRL_TASK too long
    assert result is None and "could not start" in error


@pytest.mark.parametrize("leftover", ["sleep 1000 &", "escaped"])
def test_a_command_whose_child_keeps_its_output_open_ends_at_the_timeout(leftover, pidfile, exits):
    """At the timeout the command's group is killed and its pipes closed: a child in its group dies with
    it, one that left the group (setsid) holds pipes nobody reads any more; either way play returns."""
    child = escaped(pidfile) if leftover == "escaped" else leftover
    agent = CommandAgent(f"{child} echo started; sleep 600", timeout=2)
    start = time.monotonic()
    result, error = agent.play({}, "u", "k")
    assert result is None and "agent_timeout=2" in error
    assert time.monotonic() - start < 2 + 10


def test_a_command_that_exits_leaving_a_child_on_its_output_gives_its_result(pidfile, exits):
    """It printed its result and exited: what its leftover holds open is read a moment more, then left."""
    agent = CommandAgent(f"{escaped(pidfile)} echo '{{\"reward\": 1}}'", timeout=60)
    start = time.monotonic()
    assert agent.play({}, "u", "k") == ({"reward": 1}, "")
    assert time.monotonic() - start < 10


def test_killing_the_agent_ends_an_episode_whose_child_holds_its_output(pidfile):
    agent = CommandAgent(f"{escaped(pidfile)} sleep 600", timeout=600)
    answer: list = []
    thread = threading.Thread(target=lambda: answer.append(agent.play({}, "u", "k")))
    thread.start()
    deadline = time.monotonic() + 30
    while not (agent.procs and pidfile.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.close()
    thread.join(10)
    assert answer == [(None, "the run is stopping")]


def test_a_command_that_cannot_start_stops_the_run(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"agent_command='/no/such/agent' cannot start: .*not found"):
        CommandAgent("/no/such/agent", 30).play({}, "u", "k")
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho 1\n")
    with pytest.raises(ValueError, match=r"agent\.sh' cannot start: .*[Pp]ermission denied"):
        CommandAgent(str(script), 30).play({}, "u", "k")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert CommandAgent(str(script), 30).play({}, "u", "k") == (1, "")
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tmp_path / "empty"))  # no shell to run any command with
        with pytest.raises(ValueError, match="cannot start"):
            CommandAgent("true", 30).play({}, "u", "k")


def test_exit_127_after_a_good_episode_or_some_output_loses_only_that_episode(tmp_path):
    marker = tmp_path / "second"
    agent = CommandAgent(f"if [ -e {marker} ]; then missing-tool; else echo 1; fi", 30)
    assert agent.play({}, "u", "k") == (1, "")
    marker.touch()
    result, error = agent.play({}, "u", "k")
    assert result is None and "exited with 127" in error
    result, error = CommandAgent("echo working; missing-tool", 30).play({}, "u", "k")
    assert result is None and "exited with 127" in error
