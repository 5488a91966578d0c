"""The inside of a worker process (the other half of meshrl/pipes.py): frames on two pipes, the start
handshake, and the loop that answers each request on a thread.

Standard library only and Python >= 3.9: the agent worker (orchestrator/agents/worker.py) loads this file
by path in an agent framework's own interpreter, where meshrl is not installed. A frame is a 4-byte
little-endian length and that many bytes; what the bytes hold is the caller's choice (JSON here, a
protobuf Value in meshrl/pipes.py).

    def load(): ...                    # the user's object and what the ready frame tells the parent
    main(load, handle, rfd, wfd, threads=8, read=read_json, write=write_json)

The protocol: the worker's first frame is {"ready": true, ...} or {"ready": false, "error"}. Each request
{"id", ...} gets replies tagged with its id: one, or (a chunk answered sample by sample) one per sample
with "more": true and then {"end": true}. A request without an id gets none (a close); {"op": "shutdown"} ends
the loop after `on_shutdown`. End of file on the request pipe (the parent closed it, or died) ends it too.
"""

from __future__ import annotations  # annotations stay text: this file runs on Python 3.9

import concurrent.futures
import json
import os
import select
import struct
import sys
import threading
import time

HEADER = struct.Struct("<I")


def write_bytes(fd: int, body: bytes, deadline: float | None = None) -> None:
    """Write one frame. With a deadline (time.monotonic()) and a non-blocking fd: TimeoutError if the reader
    has not taken it all by then (a frame cut short leaves the pipe unusable: stop the reader)."""
    data = memoryview(HEADER.pack(len(body)) + body)
    while data:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([], [fd], [], wait)[1]:
            raise TimeoutError("the reading process took nothing from its pipe in time")
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


def read_bytes(fd: int) -> bytes | None:
    """The next frame's bytes, or None at end of file (the other side is gone)."""
    header = _read_exactly(fd, HEADER.size)
    return None if header is None else _read_exactly(fd, HEADER.unpack(header)[0])


def write_json(fd: int, value, deadline: float | None = None) -> None:
    write_bytes(fd, json.dumps(value).encode(), deadline)  # ASCII: a lone surrogate travels escaped


def read_json(fd: int):
    body = read_bytes(fd)
    return None if body is None else json.loads(body)


def main(load, handle, rfd: int, wfd: int, *, threads: int, read=read_json, write=write_json, on_shutdown=None):
    """Load, say ready (or why not), then answer requests: handle(obj, request) -> a reply, or an iterable
    of replies sent as each comes (a chunk answered sample by sample)."""
    os.dup2(2, 1)  # what user code prints must not reach the frames
    try:
        obj, ready = load()
    except Exception as e:  # noqa: BLE001 - sent to the parent, which says why no worker started
        write(wfd, {"ready": False, "error": str(e) or type(e).__name__})
        return
    write(wfd, {"ready": True, **ready})
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="meshrl-worker")
    lock = threading.Lock()  # replies from many threads, one frame at a time

    def answer(request: dict) -> None:
        try:
            replies = handle(obj, request)
            if isinstance(replies, dict):
                last = replies
            else:  # a chunk: each reply as it comes, then the end of the call
                for reply in replies:
                    send(request, {**reply, "more": True})
                last = {"end": True}
        except Exception as e:  # noqa: BLE001 - a bug here must still answer, not leave the call hanging
            last = {"error": "aborted", "message": f"the worker failed: {type(e).__name__}: {e}"}
        send(request, last)

    def send(request: dict, reply: dict) -> None:
        if request.get("id"):
            with lock:
                write(wfd, {**reply, "id": request["id"]})

    while True:
        request = read(rfd)
        if request is None:
            return
        if request.get("op") == "shutdown":
            if on_shutdown is not None:
                on_shutdown(obj)
            return
        pool.submit(answer, request)


def run(entry, argv) -> None:
    """A worker's __main__: entry(argv), then out at once (os._exit: a hung call's thread cannot be joined)."""
    try:
        entry(argv)
    except BrokenPipeError:  # the parent went away
        pass
    finally:
        sys.stderr.flush()
        os._exit(0)
