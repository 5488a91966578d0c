"""The memory of a whole GRPO run at Qwen2.5-0.5B's shape with the vLLM rollout (issue 46 item 5's goal: a
full fine-tune within 14 GiB on this machine).

A random Qwen2 of Qwen2.5-0.5B's shape (494M parameters, 151,936-token vocabulary, tied embeddings; the
tiny tokenizer's ids), the arithmetic data, `meshrl grpo` for STEPS steps with every service the run
starts (vLLM rollout, one actor rank in fp32 with AdamW, reward). Every 0.2 s the proportional set size
(PSS: shared pages, such as the weights' shared-memory segments, split between the processes mapping
them) of the run's process tree is read from /proc; reported: the peak of the sum, and each process's
own peak, by role.

    .venv/bin/python bench/real_size_bench.py [--steps 2] [override ...]
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

from rollout_bench import SYNC_MODELS

from meshrl.tiny.models import make_model

GiB = 2**30


def tree(root: int) -> list[int]:
    """root and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def pss(pid: int) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def role(pid: int) -> str:
    try:
        args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in args if a]
    if "serve" in words:
        return words[words.index("serve") + 1]
    if "services.actor.rank" in words:
        return "actor rank"
    return "orchestrator" if "grpo" in words else pathlib.Path(words[0]).name if words else "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="real-size-"))
    model = make_model(work / "model", SYNC_MODELS["0.5B"])
    meshrl = str(pathlib.Path(sys.executable).parent / "meshrl")
    subprocess.run([meshrl, "make-data", str(work / "data")], check=True, stdout=subprocess.DEVNULL)
    command = [
        meshrl,
        "grpo",
        "--config",
        "configs/arithmetic_grpo.yaml",
        f"actor.model={model}",
        f"data.train_files={work / 'data/train.parquet'}",
        f"trainer.run_dir={work / 'run'}",
        f"trainer.total_steps={args.steps}",
        "trainer.val_every=0",
        "rollout.backend=vllm",
        "data.train_batch_size=8",
        "rollout.n=4",
        "rollout.max_new_tokens=32",
        "actor.mini_batch_size=32",
        *args.overrides,
    ]
    print(" ".join(command[1:]), flush=True)
    proc = subprocess.Popen(command)
    peak, own = 0, dict[str, int]()
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            total = 0
            for pid in tree(proc.pid):
                size = pss(pid)
                total += size
                name = f"{role(pid)} ({pid})"
                own[name] = max(own.get(name, 0), size)
            peak = max(peak, total)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    t0 = time.perf_counter()
    watcher.start()
    rc = proc.wait()
    done.set()
    watcher.join()
    print(f"rc {rc} in {time.perf_counter() - t0:.0f} s; peak of the run's total PSS: {peak / GiB:.2f} GiB")
    for name, size in sorted(own.items(), key=lambda kv: -kv[1]):
        if size > 0.1 * GiB:
            print(f"  {name}: {size / GiB:.2f} GiB")
    return rc


if __name__ == "__main__":
    os.chdir(pathlib.Path(__file__).resolve().parents[1])
    sys.exit(main())
