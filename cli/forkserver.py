"""The fork server itself (`python -m cli.forkserver FD`, started by meshrl.forkserver.start()): imports
what every service needs, then forks a child for each request on the socket it was given, and reports
each child's exit status back on it. In a child, the request's `meshrl` command runs as `meshrl ARGV`
would, outside the server's own frames. The caller's side, and why, is meshrl/forkserver.py.
"""

import importlib
import os
import select
import signal
import socket
import sys

import setproctitle

from meshrl.forkserver import receive, send
from meshrl.lifeline import VAR as PARENT
from meshrl.lifeline import die_with_parent

# what every service imports before it serves; a model family's own modules beyond these come with the model
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation.utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "services.actor.main",
    "services.rollout.main",
    "services.reward.main",
    "services.env.main",
    "cli.main",
)


def serve(sock: socket.socket) -> list[str] | None:
    """Fork a child for each request until the caller goes away; returns None in the server, and in each
    child the argv it is to run (the caller of serve then runs it, outside the server's frames)."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        while True:
            ready, _, _ = select.select([sock.fileno(), wake_read], [], [])
            if wake_read in ready:
                os.read(wake_read, 4096)
            reap(sock)
            if sock.fileno() not in ready:
                continue
            message, fd = receive(sock)
            if message is None:
                return None
            argv = fork(sock, message, fd, (wake_read, wake_write))
            if argv is not None:
                return argv
    except OSError:  # the caller is gone mid-reply
        return None


def reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def fork(sock: socket.socket, message: dict, stdout_fd: int | None, wake: tuple[int, int]) -> list[str] | None:
    try:
        pid = os.fork()
    except OSError as e:
        if stdout_fd is not None:
            os.close(stdout_fd)
        send(sock, {"failed": message["id"], "argv": message["argv"], "error": str(e)})
        return None
    if pid == 0:  # the child: a process of its own, as subprocess would have started it
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in wake:
            os.close(fd)
        os.setsid()
        if stdout_fd is not None:
            os.dup2(stdout_fd, 1)
            os.close(stdout_fd)
        os.environ.clear()
        os.environ.update(message["env"])
        os.environ[PARENT] = str(os.getppid())  # it dies with this server, which dies with the caller
        return message["argv"]
    if stdout_fd is not None:
        os.close(stdout_fd)
    pidfd = os.pidfd_open(pid)  # before reap() can see it exit: the pid is still this child's
    try:
        send(sock, {"forked": message["id"], "pid": pid}, pidfd)
    finally:
        os.close(pidfd)
    return None


def main(fd: int) -> int:
    die_with_parent()
    # before a child replaces its environment: setproctitle claims the memory of argv and environ on first use
    setproctitle.setproctitle(f"{sys.executable} -m cli.forkserver (meshrl's fork server)")
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional extra that is missing: the child imports (and reports) it
            pass
    argv = serve(sock)
    if argv is None:  # the caller is gone or done: nothing is held here, and the interpreter's teardown
        os._exit(0)  # of the preloaded modules would hold the caller's stop up by a second or more
    # `ps`, top and psutil show what a fresh process's command line would, not this server's
    setproctitle.setproctitle(" ".join([sys.executable, "-m", "cli", *argv]))
    sys.argv = ["meshrl", *argv]
    from cli.main import exit_at_once
    from cli.main import main as meshrl

    code = meshrl(argv)
    exit_at_once(argv, code)
    return code


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
