"""An environment worker process: loads the environment class, then holds the episodes the service pins
to it and runs their calls, each on a thread of its own (a tool waiting on I/O holds back no other).

Started by services/env/pool.py as `python -m services.env.worker SPEC THREADS READ_FD WRITE_FD`. It
answers {"ready": true, "stop": [...], "tools_json": "[...]"} (or why it cannot load the class), then
one reply per request, tagged with the request's "id" (a request without one, a close, gets none). A
request {"op": "shutdown"} closes every episode and exits. When the service goes away (end of file) it exits at once:
os._exit, since a hung call's thread could never be joined. What the environment prints goes to stderr.
"""

import concurrent.futures
import json
import os
import sys
import threading

from meshrl.lifeline import die_with_parent
from meshrl.loading import load_named
from meshrl.pipes import read_frame, write_frame
from services.env.episodes import Episodes, describe


def serve(episodes: Episodes, threads: int, rfd: int, wfd: int) -> None:
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="meshrl-env")
    write_lock = threading.Lock()  # replies from many threads, one frame at a time

    def answer(request: dict) -> None:
        try:
            reply = episodes.handle(request)
        except Exception as e:  # noqa: BLE001 - a bug here must still answer, not leave the call hanging
            reply = {"error": "aborted", "message": f"the environment worker failed: {type(e).__name__}: {e}"}
        if request.get("id"):
            with write_lock:
                write_frame(wfd, {"id": request["id"], **reply})

    while (request := read_frame(rfd)) is not None:
        if request["op"] == "shutdown":
            episodes.close_all()
            return
        pool.submit(answer, request)


def main(argv: list[str]) -> None:
    spec, threads, rfd, wfd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    die_with_parent()  # a hung call can starve the thread that would see the service go
    os.dup2(2, 1)  # an environment's prints must not reach anything but the log
    try:
        factory = load_named(spec, "environment")
        described = describe(factory)
    except Exception as e:  # noqa: BLE001 - sent to the service, which says why no worker started
        write_frame(wfd, {"ready": False, "error": str(e) or type(e).__name__})
        return
    # the schemas as JSON text: a frame's mappings do not keep their keys' order, and a template renders it
    write_frame(wfd, {"ready": True, "stop": described["stop"], "tools_json": json.dumps(described["tools"])})
    serve(Episodes(factory), threads, rfd, wfd)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:  # the service went away
        pass
    finally:
        sys.stderr.flush()
        os._exit(0)  # threads of hung calls die with the process
