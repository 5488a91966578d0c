"""An environment worker process: loads the environment class, then holds the episodes the service pins
to it and runs their calls, each on a thread of its own (a tool waiting on I/O holds back no other).

Started by services/env/pool.py as `python -m services.env.worker SPEC THREADS READ_FD WRITE_FD`. It
answers {"ready": true, "stop": [...], "tools_json": "[...]"} (or why it cannot load the class), then
one reply per request, tagged with the request's "id" (a request without one, a close, gets none). A
request {"op": "shutdown"} closes every episode and exits. When the service goes away (end of file) it exits at once:
os._exit, since a hung call's thread could never be joined. What the environment prints goes to stderr.
The loop is meshrl/worker_main.py's.
"""

import json
import sys

from meshrl import worker_main
from meshrl.lifeline import die_with_parent
from meshrl.loading import load_named
from meshrl.pipes import read_frame, write_frame
from services.env.episodes import Episodes, describe


def load_for(spec: str):
    def loaded():
        factory = load_named(spec, "environment")
        described = describe(factory)
        # the schemas as JSON text: a frame's mappings do not keep their keys' order, and a template renders it
        return Episodes(factory), {"stop": described["stop"], "tools_json": json.dumps(described["tools"])}

    return loaded


def main(argv: list[str]) -> None:
    spec, threads, rfd, wfd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    die_with_parent()  # a hung call can starve the thread that would see the service go
    worker_main.main(
        load_for(spec),
        Episodes.handle,
        rfd,
        wfd,
        threads=threads,
        read=read_frame,
        write=write_frame,
        on_shutdown=Episodes.close_all,
    )


if __name__ == "__main__":
    worker_main.run(main, sys.argv[1:])
