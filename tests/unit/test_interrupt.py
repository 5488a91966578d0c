"""The way out of a run is bounded (orchestrator.run.interrupt, Services.stop): Ctrl-C is said at once and
raises KeyboardInterrupt, a second one or a way out past its deadline kills what the run started and
exits with the resume hint and each thread's stack, and stopping services outlasts neither a process
that ignores SIGTERM nor a client whose close() never returns. Each case runs in a process of its own:
the stop of last resort ends its process."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil

from orchestrator.lifecycle.services import Services

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a process that enters Interrupts, says "ready", then does what the case's body says
PROGRAM = """
import os, pathlib, signal, sys, time
from orchestrator.run.interrupt import Interrupts
killed = pathlib.Path(sys.argv[1])
stop = Interrupts("meshrl test", hint=lambda: "resume from step 3", kill=lambda: killed.write_text("killed"),
                  deadline=float(sys.argv[2]))
with stop:
{body}
"""


def start(tmp_path, body: str, deadline: float = 60.0) -> tuple[subprocess.Popen, object]:
    killed = tmp_path / "killed"
    code = PROGRAM.format(body=textwrap.indent(textwrap.dedent(body), "    "))
    program = tmp_path / "run.py"
    program.write_text(code)
    proc = subprocess.Popen(
        [sys.executable, str(program), str(killed), str(deadline)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc, killed


def test_the_first_ctrl_c_is_said_at_once_and_unwinds_the_run(tmp_path):
    proc, killed = start(
        tmp_path,
        """
        try:
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("unwound", flush=True)
        """,
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "unwound", (out, err)
    assert "meshrl test: interrupted: stopping the services (Ctrl-C again to stop at once)" in err
    assert not killed.exists()  # the way out was left to the run


def test_a_second_ctrl_c_kills_what_the_run_started_and_exits_at_once(tmp_path):
    proc, killed = start(
        tmp_path,
        """
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:  # a way out that would take long
            print("ready", flush=True)
            time.sleep(60)
        """,
    )
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().strip() == "ready"  # in the way out now
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert killed.read_text() == "killed"
    last = err.strip().splitlines()[-1]
    assert last == "meshrl test: interrupted by the user (stopped at once on a second Ctrl-C); resume from step 3"
    assert "Traceback" not in err


def test_a_way_out_past_its_deadline_shows_where_it_hung_and_ends(tmp_path):
    proc, killed = start(
        tmp_path,
        """
        import threading
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            stop.arm()
            lock = threading.Lock(); lock.acquire(); lock.acquire()  # an untimed wait, as a deadlock's
        """,
        deadline=2.0,
    )
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert killed.read_text() == "killed"
    assert "stopping took over 2 s; where each thread was:" in err
    assert 'run.py", line' in err  # the main thread's stack, down to the line that hung
    assert err.strip().splitlines()[-1].endswith("(stopped after 2 s); resume from step 3")


def test_a_run_that_ends_on_its_own_and_hangs_on_the_way_out_exits_1(tmp_path):
    proc, killed = start(
        tmp_path,
        """
        print("ready", flush=True)
        stop.arm()
        lock = threading.Lock(); lock.acquire(); lock.acquire()
        """.replace("stop.arm()", "import threading; stop.arm()"),
        deadline=1.0,
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert killed.read_text() == "killed"
    assert "the run ended (stopped after 1 s)" in err


class NeverCloses:
    """A client whose close() blocks for good, as a gRPC channel can after an interrupted call."""

    def __init__(self):
        self.entered = threading.Event()

    def close(self):
        self.entered.set()
        threading.Event().wait()


def test_stopping_services_is_bounded_whatever_they_and_their_clients_do():
    stubborn = subprocess.Popen(  # ignores SIGTERM, as a service stuck in a call can seem to
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
    polite = subprocess.Popen(["sleep", "120"])
    services = Services()
    services.procs = [stubborn, polite]
    client = NeverCloses()
    services.clients = {"reward": client}  # type: ignore[dict-item]
    start = time.monotonic()
    services.stop(grace=2)
    assert time.monotonic() - start < 60  # a bound that only a hang crosses (the grace is 2 s)
    assert client.entered.is_set()
    assert stubborn.poll() == -signal.SIGKILL and polite.poll() == -signal.SIGTERM
    assert not services.procs and not services.clients
    assert not [p for p in psutil.Process().children() if p.pid in (stubborn.pid, polite.pid)]


def test_the_installed_command_exits_at_once_after_a_run(monkeypatch):
    """Issue 58.14: the installed `meshrl` (pyproject's entry point) did the interpreter's whole teardown
    (~2.7 s at every run's end and Ctrl-C) because only `python -m cli` took the fast exit."""
    import tomllib

    import cli.main

    root = pathlib.Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["meshrl"] == "cli.main:console"
    exits = []
    monkeypatch.setattr(cli.main, "main", lambda: 130)
    monkeypatch.setattr(cli.main.os, "_exit", exits.append)
    monkeypatch.setattr(cli.main.sys, "argv", ["meshrl", "grpo", "--config", "x.yaml"])
    assert cli.main.console() == 130 and exits == [130]
    monkeypatch.setattr(cli.main.sys, "argv", ["meshrl", "report", "runs/x"])  # other commands return as usual
    assert cli.main.console() == 130 and exits == [130]
