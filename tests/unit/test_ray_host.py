"""The words a failed step on a Ray cluster gets about the processes a ServiceHost started (no Ray needed:
the host's bookkeeping is plain subprocesses)."""

import signal
import subprocess
import sys

from orchestrator.ray_launch import ServiceHost, exit_words


def test_a_killed_rank_is_named_with_its_signal_and_a_running_one_is_not():
    host = ServiceHost()
    host.host = "127.0.0.3"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    host.ranks = {1: subprocess.Popen(sleeper), 2: subprocess.Popen(sleeper)}
    try:
        host.ranks[1].send_signal(signal.SIGKILL)
        host.ranks[1].wait(10)
        assert host.ended() == ["rank 1 on 127.0.0.3 was killed by SIGKILL (what an out-of-memory killer sends)"]
    finally:
        host.stop()
    assert host.ranks[2].returncode == -signal.SIGTERM  # stop() ends the rest


def test_exit_words():
    assert exit_words(3) == "exited with code 3"
    assert exit_words(-signal.SIGSEGV) == "was killed by SIGSEGV"
    assert exit_words(None) == "is running"
