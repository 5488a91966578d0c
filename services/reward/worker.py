"""A scoring worker process: loads one function, then scores the samples the pool sends it.

Started by WorkerPool as `python -m services.reward.worker SPEC BATCHED READ_FD WRITE_FD`.
It answers "ready" (or why it could not load the function) and whether the function takes
lists (verl's batched form, or TRL's form, which it finds only now, from the signature), then for each task
one reply per sample as it finishes (one reply per task when batched), so the
pool can tell which sample hangs. Output the function prints goes to stderr.
"""

import os
import sys
import traceback

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


def main(argv: list[str]) -> int:
    spec, batched, rfd, wfd = argv[0], argv[1] == "1", int(argv[2]), int(argv[3])
    os.dup2(2, 1)  # a user function's prints must not reach anything but the log
    try:
        fn = load(spec, batched)
    except Exception as e:  # noqa: BLE001 - sent to the pool, which refuses to start
        write_frame(wfd, {"ready": False, "error": str(e) or _error(e)})
        return 1
    batched = is_batched(fn, batched)
    write_frame(wfd, {"ready": True, "batched": batched, "none_ok": isinstance(fn, TRLCall)})
    while (task := read_frame(rfd)) is not None:
        samples = task["samples"]
        if batched:
            write_frame(wfd, {"id": task["id"], "results": score_batch(fn, samples)})
            continue
        for i, args in enumerate(samples):
            write_frame(wfd, {"id": task["id"], "i": i, **score_one(fn, args)})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # the pool went away
        sys.exit(0)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
