"""A killed orchestrator takes its services with it: kill -9 mid-run leaves no actor, rank, rollout,
reward service or worker behind (meshrl.lifeline); Ctrl-C is reported as an interrupt, with the resume
hint, and the services stop after the orchestrator."""

import os
import signal
import subprocess
import time

import psutil
import pytest

from testkit.runs import grpo_command


def wait_for_step_one(orchestrator, run):
    deadline = time.time() + 240
    while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip():
        assert orchestrator.poll() is None and time.time() < deadline, "the run did not reach step 1"
        time.sleep(0.5)


def kill_all(orchestrator: subprocess.Popen, family: list[psutil.Process]) -> None:
    """What a failure left: the run and its services (only this run's: other tests' processes are children
    of pytest too)."""
    if orchestrator.poll() is None:
        orchestrator.kill()
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def finish(orchestrator: subprocess.Popen, timeout: float = 120) -> str:
    """Its stderr once it exits; a hang fails with every thread's stack (faulthandler on SIGUSR1, cli.main)."""
    try:
        return orchestrator.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.kill(orchestrator.pid, signal.SIGUSR1)
        time.sleep(3)
        orchestrator.kill()
        err = orchestrator.communicate()[1]
        pytest.fail(f"the orchestrator hung after Ctrl-C; its stacks:\n{err[-12000:]}")


def interrupted(orchestrator: subprocess.Popen) -> tuple[str, str]:
    """(stderr, its last line) of a run that Ctrl-C ended as an interrupt: exit 130, no traceback."""
    err = finish(orchestrator)
    assert orchestrator.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return err, err.strip().splitlines()[-1]


def start_in_a_terminal(command: list[str]) -> subprocess.Popen:
    """A run in its own process group, standing for the terminal's foreground group."""
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def test_ctrl_c_is_an_interrupt_not_a_service_failure(tiny_lm, arithmetic_data, tmp_path):
    """The terminal sends SIGINT to its whole foreground process group; the services must not be in it (they
    died first, and the run reported "RewardService.Score ... Connection refused"). It is said at once, and
    the way out is bounded (orchestrator.run.interrupt)."""
    run = tmp_path / "run"
    orchestrator = start_in_a_terminal(grpo_command(tiny_lm, arithmetic_data, run, 1000))
    family = []
    try:
        wait_for_step_one(orchestrator, run)
        family = psutil.Process(orchestrator.pid).children(recursive=True)
        os.killpg(orchestrator.pid, signal.SIGINT)
        err, last = interrupted(orchestrator)
        assert "meshrl grpo: interrupted: stopping the services (Ctrl-C again to stop at once)" in err
        assert "interrupted by the user" in last and "trainer.resume=true" in last, last
        assert "Connection refused" not in err and "error" not in last, err[-3000:]
        assert not psutil.wait_procs(family, timeout=60)[1]  # and the services stopped after it
    finally:
        kill_all(orchestrator, family)


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(tiny_lm, arithmetic_data, tmp_path):
    """The reward service stopped (SIGSTOP) does not act on SIGTERM, so the first Ctrl-C's way out waits on
    it; the second Ctrl-C kills every service and exits 130 with the resume hint."""
    run = tmp_path / "run"
    orchestrator = start_in_a_terminal(grpo_command(tiny_lm, arithmetic_data, run, 1000))
    family = []
    try:
        wait_for_step_one(orchestrator, run)
        family = psutil.Process(orchestrator.pid).children(recursive=True)
        reward = [p for p in family if "serve reward" in " ".join(p.cmdline())]
        assert len(reward) == 1, [p.cmdline() for p in family]
        reward[0].suspend()
        os.killpg(orchestrator.pid, signal.SIGINT)
        time.sleep(2)
        assert orchestrator.poll() is None  # waiting on the stopped reward service
        os.killpg(orchestrator.pid, signal.SIGINT)
        _, last = interrupted(orchestrator)
        assert "stopped at once on a second Ctrl-C" in last and "trainer.resume=true" in last, last
        assert not psutil.wait_procs(family, timeout=60)[1]
    finally:
        kill_all(orchestrator, family)


def test_services_die_with_a_killed_orchestrator(tiny_lm, arithmetic_data, tmp_path):
    run = tmp_path / "run"
    orchestrator = subprocess.Popen(
        grpo_command(tiny_lm, arithmetic_data, run, 1000, "actor.world_size=2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    family = []
    try:
        wait_for_step_one(orchestrator, run)
        family = psutil.Process(orchestrator.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()[3:5]) for p in family)
        assert len(family) >= 4 and "serve actor" in names and "serve rollout" in names, names  # + rank 1, reward
        os.kill(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait()
        gone, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        kill_all(orchestrator, family)


@pytest.mark.parametrize("forked", [True, False])
def test_services_are_forked_from_the_fork_server_unless_it_is_turned_off(tiny_lm, arithmetic_data, tmp_path, forked):
    """By default the services' parent is the run's fork server (cli/forkserver.py), itself a child of the
    orchestrator; with trainer.fork_server=false each is the orchestrator's own child, and no server is
    left running."""
    run = tmp_path / "run"
    extra = [] if forked else ["trainer.fork_server=false"]
    orchestrator = subprocess.Popen(
        grpo_command(tiny_lm, arithmetic_data, run, 1000, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    family = []
    try:
        wait_for_step_one(orchestrator, run)
        family = psutil.Process(orchestrator.pid).children(recursive=True)
        servers = [p for p in family if "cli.forkserver" in " ".join(p.cmdline())]
        services = [p for p in family if "-m cli serve" in " ".join(p.cmdline())]
        assert len(services) >= 3, [p.cmdline() for p in family]  # actor, rollout, reward
        if forked:
            assert len(servers) == 1 and servers[0].ppid() == orchestrator.pid
            assert all(p.ppid() == servers[0].pid for p in services)
        else:
            assert not servers and all(p.ppid() == orchestrator.pid for p in services)
    finally:
        orchestrator.kill()
        orchestrator.wait()
        psutil.wait_procs(family, timeout=60)
