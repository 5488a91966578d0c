"""In-flight weight updates (rollout.on_update=keep) against waiting for the generation (wait): how long the
push takes to return, and how long the generation in flight stalls for it, against the load itself (issue
46 item 1; goal: the generation stalls no longer than the load).

One hf rollout service in this process (gRPC on loopback), a ~50M Llama-style model, a Generate of 32 rows
x 96 new tokens in a thread; a push of new weights (shm, one bucket) is sent once the generation is 8
steps in. Each engine step's start is timed at the gate (keep) or by the backend's per-step check (wait).

    .venv/bin/python bench/inflight_bench.py [--repeats 3]
"""

import argparse
import pathlib
import statistics
import tempfile
import threading
import time

from safetensors.torch import load_file

from meshrl import weights
from meshrl.codec import Payload
from meshrl.config.rollout import RolloutConfig
from meshrl.dataproto import DataProto
from meshrl.rpc import Client, Server
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import rollout_pb2
from services.rollout import gate as gate_module
from services.rollout import servicer as servicer_module

ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
MODEL = TinyModelConfig(hidden_size=640, num_layers=8, num_heads=10, num_kv_heads=5, intermediate_size=2560)
ROWS, NEW, PUSH_AT = 32, 96, 8


def chats(*questions: str) -> DataProto:
    return DataProto(non_tensor_batch={"prompt": [[{"role": "user", "content": q}] for q in questions]})


def generate(client: Client, data: DataProto, **sampling) -> Payload:
    params = rollout_pb2.SamplingParams(n=1, temperature=1.0, logprobs=True, **sampling)
    return client.call("Generate", Payload(rollout_pb2.GenerateRequest(sampling=params), data))


def one(model: pathlib.Path, mode: str, new_weights: dict) -> dict:  # noqa: PLR0915 - limit: one benchmark's script, read top to bottom
    steps: list[float] = []
    parked: list[float] = []
    loads: list[tuple[float, float]] = []
    real_alive = servicer_module.Call.alive

    def timed_alive(call):  # the backend's check between two steps: it blocks while the call is parked
        t = time.monotonic()
        ok = real_alive(call)
        steps.append(time.monotonic())
        parked.append(steps[-1] - t)
        return ok

    real_pause, real_resume = gate_module.Gate.pause, gate_module.Gate.resume

    def pause(gate):
        real_pause(gate)
        loads.append((time.monotonic(), float("nan")))

    def resume(gate, version, loaded=True):
        if loads and loads[-1][1] != loads[-1][1]:  # nan: the pause this ends
            loads[-1] = (loads[-1][0], time.monotonic())
        real_resume(gate, version, loaded)

    servicer_module.Call.alive = timed_alive  # type: ignore[method-assign]
    gate_module.Gate.pause, gate_module.Gate.resume = pause, resume  # type: ignore[method-assign]
    servicer = servicer_module.RolloutServicer(
        RolloutConfig(model=str(model), backend="hf", max_model_len=256, on_update=mode)
    )
    server = Server([servicer]).start()
    client = Client(server.address, ROLLOUT, timeout=600)
    out: dict = {}
    try:
        generate(client, chats("warm up"), max_new_tokens=2)
        steps.clear()

        def long():
            out["reply"] = generate(client, chats(*[f"{i}+{i}=" for i in range(ROWS)]), max_new_tokens=NEW, seed=1)
            out["end"] = time.monotonic()

        thread = threading.Thread(target=long)
        thread.start()
        while len(steps) < PUSH_AT:
            time.sleep(0.001)
        t0 = time.monotonic()
        weights.push_state(client, new_weights, len(loads) + 1, "shm")
        pushed = time.monotonic()
        thread.join()
    finally:
        servicer_module.Call.alive = real_alive  # type: ignore[method-assign]
        gate_module.Gate.pause, gate_module.Gate.resume = real_pause, real_resume  # type: ignore[method-assign]
        server.stop(0)
        servicer.close()
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    result = {"push_s": pushed - t0, "gen_left_s": out["end"] - t0, "step_s": statistics.median(gaps)}
    if mode == "keep":
        (start, end) = loads[-1]
        result["load_s"] = end - start
        # the gap between steps that holds the load, less a step's own time: what the pause cost the
        # generation; and the slowest other step (the push's copying shares the cores with generation)
        around = [b - a for a, b in zip(steps, steps[1:]) if a <= start and b >= end]
        result["stall_s"] = around[0] - result["step_s"]
        result["parked_s"] = max(parked)
        result["other_s"] = max(g for g in gaps if g not in around) - result["step_s"]
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = make_model(pathlib.Path(tempfile.mkdtemp()) / "m", MODEL)
    new_weights = {k: v * 1.01 for k, v in load_file(model / "model.safetensors").items()}
    n = sum(v.numel() for v in new_weights.values())
    print(f"{n / 1e6:.1f}M parameters, {ROWS} rows x {NEW} new tokens, the push sent {PUSH_AT} steps in")
    print(
        "| on_update | push returns after | generation left then | the step gap around the load, over a step "
        "| parked | load (pause to resume) | slowest other step, over a step | a step |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for mode in ("wait", "keep"):
        runs = [one(model, mode, new_weights) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        stall = f"+{med['stall_s'] * 1e3:,.0f} ms" if "stall_s" in med else "(none: the push waits)"
        park = f"{med['parked_s'] * 1e3:,.0f} ms" if "parked_s" in med else "-"
        load = f"{med['load_s'] * 1e3:,.0f} ms" if "load_s" in med else "-"
        other = f"+{med['other_s'] * 1e3:,.0f} ms" if "other_s" in med else "-"
        print(
            f"| {mode} | {med['push_s'] * 1e3:,.0f} ms | {med['gen_left_s'] * 1e3:,.0f} ms | {stall} | {park} | "
            f"{load} | {other} | {med['step_s'] * 1e3:,.0f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
