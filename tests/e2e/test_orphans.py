"""A killed orchestrator takes its services with it: kill -9 mid-run leaves no actor, rank, rollout,
reward service or worker behind (meshrl.lifeline)."""

import os
import signal
import subprocess
import sys
import time

import psutil


def test_services_die_with_a_killed_orchestrator(tiny_lm, arithmetic_data, tmp_path):
    run = tmp_path / "run"
    orchestrator = subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "grpo", f"actor.model={tiny_lm}", f"data.train_files={arithmetic_data['train']}",
         f"trainer.run_dir={run}", "trainer.total_steps=1000", "trainer.val_every=0", "trainer.logger=[console]",
         "trainer.trace=", "rollout.backend=hf", "actor.world_size=2", "reward.workers=1", "data.train_batch_size=4",
         "rollout.n=2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    family = []
    try:
        deadline = time.time() + 240
        while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip():
            assert orchestrator.poll() is None and time.time() < deadline, "the run did not reach step 1"
            time.sleep(0.5)
        family = psutil.Process(orchestrator.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()[3:5]) for p in family)
        assert len(family) >= 4 and "serve actor" in names and "serve rollout" in names, names  # + rank 1, reward
        os.kill(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait()
        gone, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
        for p in family:  # what a failure left (only this run's: other tests' processes are children too)
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
