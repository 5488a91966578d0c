"""An agent worker process: loads the user's agent function once, then plays the episodes it is sent,
each on a thread of its own (an agent mostly waits on the model's answers).

Started by orchestrator/agents/pool.py as `python -m orchestrator.agents.worker SPEC THREADS READ_FD
WRITE_FD`. It answers {"ready": true} (or why it cannot load the function), then for each request {"id",
"task_json", "base_url", "api_key"} calls `agent(task, base_url, api_key)` and answers {"id", "ok":
true, "result_json"} or {"id", "ok": false, "error"}. What the agent prints goes to stderr. It exits at
end of file or with the orchestrator (meshrl.lifeline); a hung agent is killed by the pool, not asked.
"""

import concurrent.futures
import json
import os
import sys
import threading
import traceback

from meshrl.lifeline import die_with_parent
from meshrl.loading import load_named
from meshrl.pipes import read_frame, write_frame


def play(agent, request: dict) -> dict:
    try:
        result = agent(json.loads(request["task_json"]), request["base_url"], request["api_key"])
        return {"id": request["id"], "ok": True, "result_json": json.dumps(result)}
    except Exception as e:  # noqa: BLE001 - the episode is lost, the worker lives on
        where = "".join(traceback.format_exception(e)[-3:])[-2000:]
        return {"id": request["id"], "ok": False, "error": f"{type(e).__name__}: {e}".strip(), "where": where}


def main(argv: list[str]) -> None:
    spec, threads, rfd, wfd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    die_with_parent()
    os.dup2(2, 1)  # an agent's prints must not reach the frames
    try:
        agent = load_named(spec, "agent")
    except Exception as e:  # noqa: BLE001 - sent to the run, which says why no worker started
        write_frame(wfd, {"ready": False, "error": str(e) or type(e).__name__})
        return
    write_frame(wfd, {"ready": True})
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="meshrl-agent")
    lock = threading.Lock()  # replies from many threads, one frame at a time

    def answer(request: dict) -> None:
        reply = play(agent, request)
        with lock:
            write_frame(wfd, reply)

    while (request := read_frame(rfd)) is not None:
        pool.submit(answer, request)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:  # the run went away
        pass
    finally:
        sys.stderr.flush()
        os._exit(0)
