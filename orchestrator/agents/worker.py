"""An agent worker process: loads the user's agent function once, then plays the episodes it is sent,
each on a thread of its own (an agent mostly waits on the model's answers).

Standard library only, Python >= 3.9, and run by path, so that any interpreter runs it: meshrl's own, or
the one rollout.agent_python names (a venv with the agent's framework and no meshrl). Started by
orchestrator/agents/pool.py (through interpreter.py) as

    PYTHON .../orchestrator/agents/worker.py SPEC THREADS READ_FD WRITE_FD

Its frames, handshake and loop are meshrl/worker_main.py's (standard library too, loaded by path), with
JSON frames. The worker answers {"ready": true, "score_group": whether the agent's module defines one}
(or {"ready": false, "error"}: why it cannot load the function), then for each request {"id", "task_json",
"base_url", "api_key"} calls `agent(task, base_url, api_key)` on a thread, and for each {"id", "op":
"score_group", "keys", "tasks_json", "results_json"} calls `score_group(keys, tasks, results)`; it
answers {"id", "ok": true, "result_json"} or {"id", "ok": false, "error", "where"}. What the agent prints
goes to stderr. It exits at end of file on READ_FD: when the run closes its end, or dies (kill -9
included: the kernel closes it); a hung agent is killed by the pool, not asked.
"""

from __future__ import annotations  # annotations stay text: this file runs on Python 3.9

import importlib.util
import inspect
import json
import os
import pathlib
import sys
import traceback


def by_path(name: str):
    """meshrl/NAME.py, loaded by path: meshrl need not be installed in the interpreter this runs in."""
    path = pathlib.Path(__file__).resolve().parents[2] / "meshrl" / f"{name}.py"
    module_spec = importlib.util.spec_from_file_location(f"meshrl_{name}", path)
    module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
    module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def loaded(spec: str):
    """(the agent, its module's score_group or None) and what the ready frame says of them."""
    agent = LOADING.load_named(spec, "agent function")
    group = getattr(inspect.getmodule(agent), "score_group", None)
    group = group if callable(group) else None
    return (agent, group), {"score_group": group is not None}


def play(functions, request: dict) -> dict:
    agent, group = functions
    try:
        if request.get("op") == "score_group":
            tasks, results = json.loads(request["tasks_json"]), json.loads(request["results_json"])
            result = group(request["keys"], tasks, results)
        else:
            result = agent(json.loads(request["task_json"]), request["base_url"], request["api_key"])
        return {"ok": True, "result_json": json.dumps(result)}
    except Exception as e:  # noqa: BLE001 - the episode is lost, the worker lives on
        where = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])[-2000:]
        return {"ok": False, "error": f"{type(e).__name__}: {e}".strip(), "where": where}


def main(argv: list[str]) -> None:
    spec, threads, rfd, wfd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    # imports as under `python -m`: the run's folder first, never this file's own (its siblings are not
    # the agent's modules)
    here = str(pathlib.Path(__file__).resolve().parent)
    sys.path[:] = [os.getcwd(), *(p for p in sys.path if p and str(pathlib.Path(p).resolve()) != here)]
    KIT.main(lambda: loaded(spec), play, rfd, wfd, threads=threads)


KIT, LOADING = by_path("worker_main"), by_path("loading")

if __name__ == "__main__":
    KIT.run(main, sys.argv[1:])
