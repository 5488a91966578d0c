"""A rollout fleet (rollout.replicas=2): each step's prompts are shared out over two rollout services, one
weight push reaches both, and a replica killed (SIGKILL) mid-run costs no step: its calls go to the other
replica, it is started again while the run goes on, and given the current weights before it gets work.
Each prompt part keeps its seed whichever replica serves it, so the run ends with the same weights as a
run nobody touched. The fleet's pushes send only what changed (rollout.push=delta), the untouched run's
every tensor: the replica started again has no base and takes the full weights, and then changes again."""

import json
import signal
import subprocess
import sys
import time

import psutil
import torch
from safetensors.torch import load_file

from orchestrator.config import load_config
from orchestrator.lifecycle.fleet import write_fleet
from orchestrator.main import run
from testkit.runs import chaos_settings, steps_logged

STEPS = 8
KILL_AFTER = 2  # steps logged
REWARD = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    while os.path.exists({hold!r}):  # the test holds a step here until the restarted replica listens
        time.sleep(0.05)
    return float(len(solution_str) % 3)
"""


def fleet_settings(tiny_lm, arithmetic_data, tmp_path, run_dir) -> list[str]:
    reward = tmp_path / "held_reward.py"
    reward.write_text(REWARD.format(hold=str(tmp_path / "hold")))
    return [
        *chaos_settings(tiny_lm, arithmetic_data, tmp_path, run_dir),
        f"reward.function={reward}:compute_score",
        "reward.timeout=120",
        "rollout.replicas=2",
        f"trainer.total_steps={STEPS}",
        "trainer.save_every=0",
        "data.train_batch_size=6",
    ]


def listens(p: psutil.Process) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN for c in p.net_connections(kind="tcp"))
    except psutil.NoSuchProcess:
        return False


def replicas(orchestrator: psutil.Process) -> list[psutil.Process]:
    """The rollout services under the orchestrator, in the order they started (replica 0 first)."""
    found = [p for p in orchestrator.children(recursive=True) if is_rollout(p)]
    return sorted(found, key=lambda p: p.create_time())


def is_rollout(p: psutil.Process) -> bool:
    try:
        cmd = p.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):  # the killed one, until the orchestrator reaps it
        return False
    return "serve" in cmd and cmd[cmd.index("serve") + 1] == "rollout"


def test_a_fleet_shares_each_step_and_a_killed_replica_costs_no_step(tiny_lm, arithmetic_data, tmp_path):
    fleet, log = tmp_path / "fleet", tmp_path / "fleet.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli",
                "grpo",
                *fleet_settings(tiny_lm, arithmetic_data, tmp_path, fleet),
                "rollout.push=delta",
            ],
            stdout=f,
            stderr=f,
        )
    # The run goes on while the killed replica starts again (seconds), and the steps of this tiny run take
    # a fraction of one: once its new process shows, the test holds the run in scoring until it listens,
    # so that it comes back with steps to spare on any machine.
    orchestrator, killed, held, hold = psutil.Process(proc.pid), None, False, tmp_path / "hold"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if killed is None and max(steps_logged(fleet), default=0) >= KILL_AFTER:
            found = replicas(orchestrator)
            assert len(found) == 2, [p.cmdline() for p in found]
            killed = found[1]
            killed.send_signal(signal.SIGKILL)
        elif killed is not None and not held:
            again = [
                p for p in replicas(orchestrator) if p.pid != killed.pid and p.create_time() > killed.create_time()
            ]
            if again:
                hold.touch()
                held = True
                while proc.poll() is None and not listens(again[0]) and time.monotonic() < deadline:
                    time.sleep(0.05)
                hold.unlink()
        time.sleep(0.05)
    out = log.read_text()
    assert proc.wait(60) == 0, out[-4000:]
    assert killed is not None
    assert steps_logged(fleet) == list(range(1, STEPS + 1))  # every step once: none was redone
    rows = [json.loads(line) for line in (fleet / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] >= 1]
    samples = 6 * 2  # prompts x rollout.n
    for r in rows:  # every sample was served by one replica or the other
        assert r["rollout/replica0/samples"] + r["rollout/replica1/samples"] == samples, r
    assert rows[0]["rollout/replica0/samples"] == rows[0]["rollout/replica1/samples"] == samples / 2
    assert "rollout-1" in out and "set aside" in out
    assert rows[-1]["trainer/restarts"] == 1 and "restarting rollout replica rollout-1" in out
    back = [r["step"] for r in rows if r["step"] > KILL_AFTER and r["rollout/replicas_up"] == 2]
    assert back, "the killed replica never came back"  # started again while the run went on, then given work
    assert all(r["rollout/replicas_up"] == 2 for r in rows if r["step"] >= back[0])
    last = rows[-1]
    assert last["rollout/replica0/weight_version"] == last["rollout/replica1/weight_version"] == STEPS
    # deltas from step 2 on (at this fp32 rollout and learning rate nearly every value changes: the tensors
    # travel whole, as the contract tests' bf16 ones do not; test_delta_push.py)
    assert [r["push/delta"] for r in rows] == [0.0] + [1.0] * (STEPS - 1)
    assert all(r["push/sent_mb"] <= r["push/weights_mb"] for r in rows)

    settings = fleet_settings(tiny_lm, arithmetic_data, tmp_path, tmp_path / "whole")
    whole = run("grpo", load_config(None, [*settings, "rollout.push=full"]))
    a = load_file(whole / "hf" / "model.safetensors")
    b = load_file(fleet / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_replicas_added_and_removed_while_the_run_goes_on(tiny_lm, arithmetic_data, tmp_path):
    """`meshrl fleet RUN_DIR --replicas N` on a running run: a new replica starts while the run goes on and
    gets work once it holds the current weights; a removed one is stopped. The actor trains a LoRA adapter,
    so what every replica holds, the one that joins too, is the base model with the pushed adapter."""
    run_dir, log = tmp_path / "resized", tmp_path / "resized.log"
    overrides = [
        *fleet_settings(tiny_lm, arithmetic_data, tmp_path, run_dir),
        "rollout.replicas=1",
        "actor.lora_rank=8",
    ]
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "grpo", *overrides], stdout=f, stderr=f)
    orchestrator, hold, stage = psutil.Process(proc.pid), tmp_path / "hold", "start"
    deadline = time.monotonic() + 600

    def fleet(n: int) -> None:  # what `meshrl fleet RUN_DIR --replicas N` does (its start-up would cost steps)
        write_fleet(run_dir, replicas=n)

    while proc.poll() is None and time.monotonic() < deadline:
        logged = steps_logged(run_dir)
        if stage == "start" and logged:
            fleet(2)
            stage = "adding"
        elif stage == "adding" and len(replicas(orchestrator)) == 2:
            hold.touch()  # as above: the run waits in scoring until the new replica listens
            while proc.poll() is None and not listens(replicas(orchestrator)[1]) and time.monotonic() < deadline:
                time.sleep(0.05)
            hold.unlink()
            stage = "added"
        elif stage == "added" and rows_of(run_dir) and rows_of(run_dir)[-1].get("rollout/replicas_up") == 2:
            fleet(1)
            stage = "removing"
        time.sleep(0.05)
    out = log.read_text()
    assert proc.wait(60) == 0, out[-4000:]
    assert stage == "removing", out[-3000:]
    assert steps_logged(run_dir) == list(range(1, STEPS + 1))
    rows = rows_of(run_dir)
    two = [r for r in rows if r.get("rollout/replicas_up") == 2]
    assert two and all(r["rollout/replica1/weight_version"] == r["step"] for r in two)  # work only once current
    assert sum(r["rollout/replica1/samples"] for r in two) > 0
    assert "rollout/replica1/samples" not in rows[-1] and "rollout replica rollout-1 removed" in out


def rows_of(run_dir) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [r for r in (json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()) if r["step"] >= 1]
