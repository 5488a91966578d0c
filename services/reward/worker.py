"""A scoring worker process: loads one function, then scores the samples the pool sends it.

Started by WorkerPool as `python -m services.reward.worker SPEC BATCHED READ_FD WRITE_FD`.
It answers "ready" (or why it could not load the function) and whether the function takes
lists (verl's batched form, or TRL's form, which it finds only now, from the signature), then for each
chunk one reply per sample as it finishes (one reply per chunk when batched), so the pool can tell which
sample hangs, on one thread: a user's function need not be thread-safe (meshrl/worker_main.py).
"""

import sys

from meshrl import worker_main
from meshrl.pipes import read_frame, write_frame
from services.reward.functions import TRLCall, check_result, is_batched, load


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def checked(result, none_ok: bool = False) -> dict:
    try:
        score, extras = check_result(result, none_ok)
    except ValueError as e:
        return {"error": str(e)}
    return {"score": score, "extras": extras}


def score_one(fn, args) -> dict:
    try:
        result = fn(*args)
    except Exception as e:  # noqa: BLE001 - reported for this sample, the worker goes on
        return {"error": _error(e)}
    return checked(result)


def score_batch(fn, samples) -> list[dict]:
    """Scores of a batch from a function that takes lists; TRL's may answer None ("no score")."""
    try:
        results = fn(*(list(col) for col in zip(*samples)))
    except Exception as e:  # noqa: BLE001
        return [{"error": _error(e)}] * len(samples)
    if not isinstance(results, (list, tuple)) or len(results) != len(samples):
        n = len(results) if isinstance(results, (list, tuple)) else f"a {type(results).__name__}, not"
        return [{"error": f"batched function returned {n} results for {len(samples)} samples"}] * len(samples)
    return [checked(r, none_ok=isinstance(fn, TRLCall)) for r in results]


def load_for(spec: str, batched: bool):
    def loaded():
        fn = load(spec, batched)
        return fn, {"batched": is_batched(fn, batched), "none_ok": isinstance(fn, TRLCall)}

    return loaded


def handle(fn, task: dict):
    """A chunk of samples: one reply for all of them when the function is batched, else one per sample as
    each is scored (so that the pool can tell which sample hangs)."""
    if "batch" in task:
        return {"results": score_batch(fn, task["batch"])}
    return (score_one(fn, args) for args in task["samples"])


def main(argv: list[str]) -> None:
    spec, batched, rfd, wfd = argv[0], argv[1] == "1", int(argv[2]), int(argv[3])
    worker_main.main(load_for(spec, batched), handle, rfd, wfd, threads=1, read=read_frame, write=write_frame)


if __name__ == "__main__":
    worker_main.run(main, sys.argv[1:])
