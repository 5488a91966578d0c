"""An agent worker process: loads the user's agent function once, then plays one episode per request.

Started by orchestrator/agents/pool.py as `python -m orchestrator.agents.worker SPEC READ_FD WRITE_FD`.
It answers {"ready": true} (or why it cannot load the function), then for each request {"task_json",
"base_url", "api_key"} calls `agent(task, base_url, api_key)` and answers {"ok": true, "result_json"}
or {"ok": false, "error"}. What the agent prints goes to stderr. It exits at end of file or with the
orchestrator (meshrl.lifeline); a hung agent is killed by the pool, not asked.
"""

import json
import os
import sys
import traceback

from meshrl.lifeline import die_with_parent
from meshrl.loading import load_named
from meshrl.pipes import read_frame, write_frame


def main(argv: list[str]) -> None:
    spec, rfd, wfd = argv[0], int(argv[1]), int(argv[2])
    die_with_parent()
    os.dup2(2, 1)  # an agent's prints must not reach the frames
    try:
        agent = load_named(spec, "agent")
    except Exception as e:  # noqa: BLE001 - sent to the run, which says why no worker started
        write_frame(wfd, {"ready": False, "error": str(e) or type(e).__name__})
        return
    write_frame(wfd, {"ready": True})
    while (request := read_frame(rfd)) is not None:
        try:
            result = agent(json.loads(request["task_json"]), request["base_url"], request["api_key"])
            reply = {"ok": True, "result_json": json.dumps(result)}
        except Exception as e:  # noqa: BLE001 - the episode is lost, the worker lives on
            tail = traceback.format_exception(e)[-3:]
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}".strip(), "where": "".join(tail)[-2000:]}
        write_frame(wfd, reply)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:  # the run went away
        pass
    finally:
        sys.stderr.flush()
        os._exit(0)
