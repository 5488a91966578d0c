"""An agent worker process: loads the user's agent function once, then plays the episodes it is sent,
each on a thread of its own (an agent mostly waits on the model's answers).

Standard library only, Python >= 3.9, and run by path, so that any interpreter runs it: meshrl's own, or
the one rollout.agent_python names (a venv with the agent's framework and no meshrl). Started by
orchestrator/agents/pool.py (through interpreter.py) as

    PYTHON .../orchestrator/agents/worker.py SPEC THREADS READ_FD WRITE_FD

The protocol is written here once (pool.py imports read_frame and write_frame from this file): frames
are a 4-byte little-endian length and that many bytes of JSON. The worker answers {"ready": true} (or
{"ready": false, "error"}: why it cannot load the function), then for each request {"id", "task_json",
"base_url", "api_key"} calls `agent(task, base_url, api_key)` on a thread and answers {"id", "ok": true,
"result_json"} or {"id", "ok": false, "error", "where"}. What the agent prints goes to stderr. It exits at
end of file on READ_FD: when the run closes its end, or dies (kill -9 included: the kernel closes it); a
hung agent is killed by the pool, not asked.
"""

from __future__ import annotations  # annotations stay text: this file runs on Python 3.9

import concurrent.futures
import importlib
import importlib.util
import json
import os
import pathlib
import struct
import sys
import threading
import traceback

HEADER = struct.Struct("<I")


def write_frame(fd: int, value) -> None:
    """Write one JSON value (a blocking fd: the call returns once the reader's pipe took it all)."""
    body = json.dumps(value).encode()  # ASCII: a lone surrogate in a task travels escaped
    data = memoryview(HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int):
    """The next value, or None at end of file (the other side is gone)."""
    header = _read_exactly(fd, HEADER.size)
    body = None if header is None else _read_exactly(fd, HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def load(spec: str):
    """The callable `name` of spec "path/to/file.py:name" or "package.module:name"; ValueError saying why
    not (the module imported in this interpreter, with its packages)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError("must look like path/to/file.py:function or module:function")
    module_spec = None
    if path.endswith(".py"):
        file = pathlib.Path(path).expanduser().resolve()
        if not file.is_file():
            raise ValueError(f"file {file} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"meshrl_agent_{abs(hash(str(file)))}", file)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"{file} is not a Python module")
    try:
        if module_spec is None:
            module = importlib.import_module(path)
        else:
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module  # dataclasses in user code look their module up
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the run says why, in one line
        where = f"Python {sys.version.split()[0]} ({sys.executable})"
        raise ValueError(f"could not import {path} with {where}: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{path} has no function {name!r}")
    return fn


def play(agent, request: dict) -> dict:
    try:
        result = agent(json.loads(request["task_json"]), request["base_url"], request["api_key"])
        return {"id": request["id"], "ok": True, "result_json": json.dumps(result)}
    except Exception as e:  # noqa: BLE001 - the episode is lost, the worker lives on
        where = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])[-2000:]
        return {"id": request["id"], "ok": False, "error": f"{type(e).__name__}: {e}".strip(), "where": where}


def main(argv: list[str]) -> None:
    spec, threads, rfd, wfd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    # imports as under `python -m`: the run's folder first, never this file's own (its siblings are not
    # the agent's modules)
    here = str(pathlib.Path(__file__).resolve().parent)
    sys.path[:] = [os.getcwd(), *(p for p in sys.path if p and str(pathlib.Path(p).resolve()) != here)]
    os.dup2(2, 1)  # an agent's prints must not reach the frames
    try:
        agent = load(spec)
    except ValueError as e:  # sent to the run, which says why no worker started
        write_frame(wfd, {"ready": False, "error": str(e)})
        return
    write_frame(wfd, {"ready": True})
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="meshrl-agent")
    lock = threading.Lock()  # replies from many threads, one frame at a time

    def answer(request: dict) -> None:
        reply = play(agent, request)
        with lock:
            write_frame(wfd, reply)

    while True:
        request = read_frame(rfd)
        if request is None:
            return
        pool.submit(answer, request)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:  # the run went away
        pass
    finally:
        sys.stderr.flush()
        os._exit(0)
