"""The sandbox service over real gRPC on 127.0.0.1, with real bubblewrap sandboxes: a program runs with its
files, input and limits and says what it did; sessions keep files between Runs; and each way hostile code
could do harm is tried (the network, the host's files and environment, a fork bomb, a memory bomb, endless
output, a full disk, CPU and sleep past the limits, children left behind, processes that each stay within
their own memory but not together), after each of which the service answers the next Run as before; and a
service killed mid-Run leaves no sandbox behind, and the next start removes the cgroups it left."""

import concurrent.futures
import dataclasses
import os
import socket
import subprocess
import time

import grpc
import pytest

from meshrl.config.sandbox import SandboxConfig
from meshrl.errors import ServiceError
from meshrl.lifeline import serve_child
from meshrl.rpc import Client, Server
from meshrl.v1 import sandbox_pb2
from services.sandbox import cgroups
from services.sandbox.servicer import SandboxServicer

SERVICE = sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"]
# the sandboxes' users: a range of this module's own on each pytest-xdist worker, so that the sandboxes other
# services hold at the same time (warm pools wait in theirs) are not taken for ones left behind here
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
UIDS = range(64000 + 512 * WORKER, 64000 + 512 * WORKER + 256)
OWN_UIDS = {"first_uid": UIDS.start, "uids": len(UIDS)}
SERVED: list[SandboxServicer] = []  # the module's service: its warm sandboxes are not left behind


@pytest.fixture(scope="module", params=[2, 0], ids=["warm", "cold"])
def sandbox(request):
    """The service with its warm pool (every Run in a sandbox started ahead), and without (each its own)."""
    os.environ["MESHRL_TEST_SECRET"] = "do-not-leak"  # as a run's token is in its services' environment
    cfg = SandboxConfig(
        concurrency=1, wall_s=5, process_limit=16, memory_mb=256, disk_mb=8, file_mb=4, output_bytes=4096, **OWN_UIDS
    )
    servicer = SandboxServicer(dataclasses.replace(cfg, warm=request.param))
    SERVED[:] = [servicer]
    server = Server([servicer]).start()
    client = Ready(Client(server.address, SERVICE, timeout=60, retries=0), servicer)
    yield client
    runs = client.call("Describe").details
    assert int(runs.get("warm_runs", 0)) == (int(runs["runs"]) if request.param else 0)  # each Run the way it says
    server.stop(0)
    servicer.close()
    os.environ.pop("MESHRL_TEST_SECRET")


class Ready:
    """A client whose every call waits for the service's warm pool to be full again first, so that with a
    pool every Run is warm (a refill takes a few milliseconds after each Run)."""

    def __init__(self, client: Client, servicer: SandboxServicer):
        self.client, self.pool = client, servicer.pool

    def call(self, method: str, request=None):
        deadline = time.monotonic() + 10
        while self.pool is not None and self.pool.count() < self.pool.size and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.client.call(method, request)


def run(client, code: str, **kw) -> sandbox_pb2.RunResponse:
    files = {"main.py": code.encode(), **kw.pop("files", {})}
    return client.call("Run", sandbox_pb2.RunRequest(argv=["python3", "main.py"], files=files, **kw))


def fine(client) -> None:
    """The service answers a plain Run as before."""
    reply = run(client, "print(6 * 7)")
    assert (reply.exit_code, reply.stdout, reply.killed) == (0, b"42\n", "")


def left_behind() -> list[str]:
    """Processes of the sandbox's user still on the machine, but the warm sandboxes waiting for a Run."""
    ready = set().union(*(s.pool.uids() for s in SERVED if s.pool is not None))
    out = subprocess.run(["ps", "-e", "-o", "uid=,pid=,stat=,comm="], capture_output=True, text=True).stdout
    mine = [line for line in out.splitlines() if int(line.split()[0]) in UIDS and int(line.split()[0]) not in ready]
    return [line for line in mine if line.split()[2][0] != "Z"]  # dead, waiting to be reaped


def test_a_program_runs_with_its_files_and_input_and_says_what_it_did(sandbox):
    code = "import sys, os\nprint(open('data/in.txt').read() + sys.stdin.read())\nopen('out.txt', 'w').write('x')\n"
    reply = run(sandbox, code, files={"data/in.txt": b"a"}, stdin=b"b", return_files=True)
    assert (reply.exit_code, reply.stdout, reply.killed, reply.truncated) == (0, b"ab\n", "", False)
    assert dict(reply.files) == {"main.py": code.encode(), "data/in.txt": b"a", "out.txt": b"x"}
    failed = run(sandbox, "raise SystemExit(3)")
    assert failed.exit_code == 3 and failed.wall_s > 0


def test_a_session_keeps_its_files_between_runs_until_closed(sandbox):
    run(sandbox, "open('notes', 'w').write('kept')", session="episode-1")
    assert run(sandbox, "print(open('notes').read())", session="episode-1").stdout == b"kept\n"
    assert run(sandbox, "import os; print(os.path.exists('notes'))").stdout == b"False\n"  # no session: clean
    assert sandbox.call("CloseSession", sandbox_pb2.CloseSessionRequest(session="episode-1")).closed
    assert run(sandbox, "import os; print(os.path.exists('notes'))", session="episode-1").stdout == b"False\n"


def test_a_session_keeps_its_files_modes_and_links(sandbox):
    """An executable stays one and a symbolic link stays a link from one Run of a session to the next, as
    in a shell between two commands; a file the request sends again takes its default mode."""

    def shell(command: str, **kw) -> sandbox_pb2.RunResponse:
        return sandbox.call("Run", sandbox_pb2.RunRequest(argv=["bash", "-c", command], session="modes", **kw))

    made = shell("mkdir bin && printf '#!/bin/sh\\necho ran\\n' > bin/tool && chmod 750 bin/tool && ln -s bin/tool go")
    assert made.exit_code == 0, made.stderr
    again = shell("./go && stat -c '%a %F' bin/tool go")
    assert (again.exit_code, again.stdout) == (0, b"ran\n750 regular file\n777 symbolic link\n"), again.stderr
    sent = shell("stat -c %a bin/tool", files={"bin/tool": b"#!/bin/sh\n"})
    assert sent.stdout != b"750\n" and sent.exit_code == 0
    assert sandbox.call("CloseSession", sandbox_pb2.CloseSessionRequest(session="modes")).closed


def test_no_network_not_even_the_machines_loopback(sandbox):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        f"for host in ('127.0.0.1', '10.0.0.1', 'example.org'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2); print('reached', host)\n"
        "    except OSError as e:\n"
        "        print('no', host)\n"
    )
    reply = run(sandbox, code)
    listener.close()
    assert reply.stdout == b"no 127.0.0.1\nno 10.0.0.1\nno example.org\n", reply.stderr
    fine(sandbox)


def test_no_host_files_and_no_environment(sandbox, tmp_path):
    secret = tmp_path / "token"
    secret.write_text("run token")
    code = (
        "import os\n"
        f"for p in ({str(secret)!r}, {os.getcwd()!r}, '/root', '/home', '/etc/passwd', '/proc/1/environ'):\n"
        "    try:\n"
        "        print(p, os.listdir(p) if os.path.isdir(p) else open(p).read()[:20])\n"
        "    except OSError:\n"
        "        print('no')\n"
        "print(sorted(os.environ))\n"
    )
    reply = run(sandbox, code)
    lines = reply.stdout.decode().splitlines()
    assert lines[:4] == ["no"] * 4 and "run token" not in reply.stdout.decode(), lines
    assert "do-not-leak" not in reply.stdout.decode()  # pid 1 is the sandbox's own: its environ is the same few
    assert lines[-1] == "['HOME', 'LANG', 'PATH', 'PWD']"  # PWD: /work, where it starts
    for where in ("/usr/bin/evil", "/evil", "/dev/evil"):  # bubblewrap's own root and /dev are read-only too
        write = run(sandbox, f"open({where!r}, 'w')")
        assert write.exit_code != 0 and b"Read-only file system" in write.stderr, where


def test_a_fork_bomb_is_held_to_its_processes_and_leaves_nothing(sandbox):
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    reply = run(sandbox, bomb, limits=sandbox_pb2.Limits(wall_s=2))
    assert reply.killed == "wall"
    time.sleep(0.5)
    assert left_behind() == []
    fine(sandbox)


def test_a_memory_bomb_fails_in_the_sandbox(sandbox):
    reply = run(sandbox, "x = bytearray(1 << 30)")
    assert reply.exit_code != 0 and b"MemoryError" in reply.stderr
    fine(sandbox)


def test_processes_within_their_own_memory_are_held_to_the_sandboxes_together(sandbox):
    """Four processes of 150 MiB each, each within its own 256 MiB, over the sandbox's cgroup (256 MiB for
    its programs and 8 for each memory-backed mount): the kernel ends one and the Run says why."""
    kind = sandbox.call("Describe").details["cgroups"]
    if kind.startswith("none"):
        pytest.skip(f"this machine gives the service no cgroups ({kind})")
    code = (
        "import os, time\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
        "        block = b'x' * (150 << 20)\n        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\n"
        "print(sorted(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids))\n"
    )
    reply = run(sandbox, code, limits=sandbox_pb2.Limits(wall_s=20))
    assert reply.killed == "memory" and b"-9" in reply.stdout, (reply.stdout, reply.stderr)
    fine(sandbox)


def test_endless_output_is_cut_and_stopped(sandbox):
    reply = run(sandbox, "while True: print('y' * 100)")
    assert (reply.killed, reply.truncated, len(reply.stdout)) == ("output", True, 4096)
    fine(sandbox)


def test_a_full_disk_is_the_sandboxes_own(sandbox):
    code = "import os\nwith open('big', 'wb') as f:\n    for _ in range(64):\n        f.write(os.urandom(1 << 20))\n"
    big = run(sandbox, code)  # past file_mb 4 (Python ignores SIGXFSZ: its write fails instead)
    assert big.exit_code == 1 and b"File too large" in big.stderr
    many = "import os\nfor i in range(64):\n    open(f'f{i}', 'wb').write(os.urandom(1 << 20))\n"
    reply = run(sandbox, many)  # each file under file_mb, together past disk_mb 8
    assert reply.exit_code != 0 and b"No space left on device" in reply.stderr
    shm = run(sandbox, many.replace("f'f{i}'", "f'/dev/shm/f{i}'"))  # memory-backed too, and as bounded
    assert shm.exit_code != 0 and b"No space left on device" in shm.stderr
    fine(sandbox)


def test_cpu_and_sleep_past_the_limits_are_stopped_and_children_go_with_them(sandbox):
    spin = run(sandbox, "while True: pass", limits=sandbox_pb2.Limits(cpu_s=1, wall_s=10))
    assert spin.exit_code == 128 + 24 and spin.wall_s < 5  # SIGXCPU from the kernel
    start = time.monotonic()
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\ntime.sleep(600)\n"
    reply = run(sandbox, code, limits=sandbox_pb2.Limits(wall_s=1))
    assert reply.killed == "wall" and time.monotonic() - start < 5
    time.sleep(0.5)
    assert left_behind() == []
    fine(sandbox)


@pytest.mark.parametrize(
    "request_kw, says",
    [
        ({"argv": []}, "argv must name a program"),
        ({"argv": ["true"], "files": {"../x": b""}}, "must be a relative path"),
        ({"argv": ["true"], "files": {"/etc/x": b""}}, "must be a relative path"),
        ({"argv": ["true"], "files": {".": b""}}, "must be a relative path"),
        ({"argv": ["true"], "limits": sandbox_pb2.Limits(wall_s=1e6)}, "limits.wall_s"),
        ({"argv": ["true"], "limits": sandbox_pb2.Limits(memory_mb=1 << 40)}, "limits.memory_mb"),
        ({"argv": ["true"], "files": {"a": b"x" * (9 << 20)}}, "more than limits.disk_mb"),
    ],
    ids=["01-no-argv", "02-dotdot", "03-absolute", "03b-dot", "04-wall", "05-memory", "06-files"],
)
def test_bad_requests_are_refused_naming_the_field(sandbox, request_kw, says):
    with pytest.raises(ServiceError, match=says) as e:
        sandbox.call("Run", sandbox_pb2.RunRequest(**request_kw))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    fine(sandbox)


def test_a_killed_service_leaves_no_sandbox_behind():
    """SIGKILL of the service (as of a whole run) in the middle of Runs: bubblewrap's --die-with-parent takes
    every sandbox with it; the cgroups it made stay, and the next service to start removes them."""
    proc, address = serve_child(["sandbox", "--concurrency", "2", "--first-uid", str(UIDS.start), "--uids", "256"])
    client = Client(address, SERVICE, timeout=60, retries=0)
    sleeper = "import subprocess, time\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\ntime.sleep(600)\n"
    pool = concurrent.futures.ThreadPoolExecutor(2)
    calls = [pool.submit(run, client, sleeper, limits=sandbox_pb2.Limits(wall_s=600)) for _ in range(2)]
    deadline = time.monotonic() + 30
    sleeping = lambda: [p for p in left_behind() if p.endswith(" sleep")]  # noqa: E731
    while len(sleeping()) < 2 and time.monotonic() < deadline:  # two sandboxes, each a sleep inside
        time.sleep(0.1)
    assert len(sleeping()) == 2 and len(left_behind()) > 4  # and the service's warm sandboxes
    place, _ = cgroups.find()
    groups = [d for p in place.parents for d in p.glob(f"{cgroups.PREFIX}{proc.pid}-*")] if place else []
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while left_behind() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left_behind() == []
    for call in calls:
        with pytest.raises(ServiceError):
            call.result(timeout=30)
    pool.shutdown()
    if place is not None:  # its sandboxes' groups, which it could not remove: the next start does
        assert groups
        SandboxServicer(SandboxConfig(concurrency=1, warm=0, **OWN_UIDS)).close()
        assert not any(d.exists() for d in groups)


def test_sessions_are_held_to_their_memory_budget():
    """--session-mb bounds all sessions' kept files together: the least recently used go first, never the
    session that just ran."""
    servicer = SandboxServicer(SandboxConfig(concurrency=1, session_mb=1, **OWN_UIDS))
    write = "open('blob', 'wb').write(b'x' * 600_000)"
    for name in ("a", "b"):
        servicer.Run(sandbox_pb2.RunRequest(argv=["python3", "-c", write], session=name), None)
    assert list(servicer.sessions) == ["b"] and len(servicer.sessions["b"].files["blob"]) == 600_000
    servicer.close()


def test_the_warm_pool_passes_over_a_dead_sandbox_and_runs_other_mounts_cold():
    """A ready sandbox killed from outside is never given a Run (the Run takes the next, or starts its own);
    a Run asking for another disk size than the pool's mounts starts its own; each is as clean as the last;
    and the pool refills only while a slot is free."""
    servicer = SandboxServicer(SandboxConfig(concurrency=1, warm=2, **OWN_UIDS))
    server = Server([servicer]).start()
    client = Ready(Client(server.address, SERVICE, timeout=60, retries=0), servicer)
    assert client.call("Describe").details["warm"] == "2 ready of 2"
    victim = servicer.pool.ready[0]
    os.killpg(victim.proc.pid, 9)
    victim.proc.wait()
    code = "import os; print(sorted(os.listdir('.')), os.statvfs('.').f_blocks * os.statvfs('.').f_frsize >> 20)"
    first = run(client, code)
    assert (first.exit_code, first.stdout) == (0, b"['main.py'] 64\n"), first.stderr
    other = run(client, code, limits=sandbox_pb2.Limits(disk_mb=96))  # past the default, within the ceiling
    assert (other.exit_code, other.stdout) == (0, b"['main.py'] 96\n"), other.stderr
    details = client.call("Describe").details
    assert (details["runs"], details["warm_runs"]) == ("2", "1")  # the dead one passed over, the 96 MiB one cold
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its one slot busy: no refill meanwhile
        slow = pool.submit(run, client, "import time; time.sleep(1)")
        time.sleep(0.6)
        assert servicer.pool.count() == 1 and not slow.done()
        assert slow.result().exit_code == 0
    client.call("Describe")  # waits for the refill once the slot is free
    assert servicer.pool.count() == 2
    server.stop(0)
    servicer.close()
    assert servicer.pool.count() == 0
    time.sleep(0.3)
    assert left_behind() == []  # its ready sandboxes went with it
