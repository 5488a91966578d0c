"""A GRPO step through the mesh against a bare one-process loop on the same device, phase by phase, and
the mesh's weight push against a device-to-device copy of the same bytes (issue 10's benchmark).

Both sides run the main job's step (configs/arithmetic_grpo.yaml with bench/peer_bench.py's
SAME_AS_TRL: 32 prompts x 8 samples, up to 8 new tokens, one optimizer step per batch at lr 1e-4,
fp32) on a fresh Llama of the given size and the bundled arithmetic task, without validation. The bare
loop is bench/peer_bare.py on --device. The mesh runs `meshrl grpo` with one actor rank and the hf
rollout (the GPU machines here have no vLLM), pushing over cuda_ipc on a GPU and shm on CPU. Medians
over steps 2.. of every run; runs alternate.

    .venv/bin/python bench/gpu_step_bench.py [--layers 12] [--hidden 768] [--steps 20] [--repeats 2]

Goals (issue 10): mesh step <= 1.03x the bare loop; push <= 3x the device copy and < 2% of the step.
"""

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import torch
from peer_bench import mesh, peer
from push_memory_bench import sized_model

from meshrl.tiny.arithmetic import make_data


def device_copy_s(nbytes: int, device: torch.device, repeats: int = 5) -> float:
    """Median seconds to copy nbytes from one buffer to another on the device."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def main() -> int:  # limit: one benchmark's script, read top to bottom
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tmp = pathlib.Path(tempfile.mkdtemp())
    model, nbytes = sized_model(tmp / "lm", a.layers, a.hidden)
    data = make_data(tmp / "data")["train"].parent
    transport = "cuda_ipc" if device.type == "cuda" else "shm"
    extra = ["trainer.val_every=0", "rollout.backend=hf", f"rollout.weight_transport={transport}", "actor.world_size=1"]
    mesh_runs, bare_runs = [], []
    for i in range(a.repeats):
        bare_runs.append(
            peer(
                sys.executable,
                "bench/peer_bare.py",
                data,
                model,
                a.steps,
                tmp / f"bare-{i}.json",
                "--device",
                device.type,
                "--val-every",
                str(a.steps + 1),
            )
        )
        mesh_runs.append(mesh(data, model, a.steps, tmp / f"mesh-{i}", *extra))
    rows = [r for run in mesh_runs for r in run["metrics"] if r["step"] > 1]
    m = {
        k: median(r.get(f"timing_s/{k}", 0.0) for r in rows)
        for k in ("step", "gen", "reward", "old_log_prob", "update_actor", "update_weights")
    }
    b = {
        "step": median(s for run in bare_runs for s in run["step_s"][1:]),
        "gen": median(s for run in bare_runs for s in run["phase_s"]["gen"][1:]),
        "update": median(s for run in bare_runs for s in run["phase_s"]["update"][1:]),
    }
    copy = device_copy_s(nbytes, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"\n{name}; model {nbytes / 2**20:,.0f} MiB fp32 ({a.layers} layers, hidden {a.hidden}); {a.steps} steps x "
        f"{a.repeats} runs a side, medians of steps 2..; push over {transport}\n"
    )
    print("| phase | mesh | bare loop | mesh / bare |")
    print("|---|---|---|---|")
    for label, mk, bk in (
        ("generate", "gen", "gen"),
        ("update (+ old log-probs)", None, "update"),
        ("step", "step", "step"),
    ):
        mv = m["update_actor"] + m["old_log_prob"] if mk is None else m[mk]
        print(f"| {label} | {mv:.3f} s | {b[bk]:.3f} s | {mv / b[bk]:.2f}x |")
    print(f"| reward (mesh only) | {m['reward']:.3f} s | | |")
    print("\n| weight push (update_weights) | device copy of the same bytes | push / copy | push / mesh step |")
    print("|---|---|---|---|")
    print(
        f"| {m['update_weights'] * 1e3:.1f} ms | {copy * 1e3:.2f} ms | {m['update_weights'] / copy:.1f}x | "
        f"{100 * m['update_weights'] / m['step']:.1f}% |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
