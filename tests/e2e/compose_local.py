"""Run a docker-compose file's services as local processes on 127.0.0.1, as Docker would run them.

For the test that the file users run is the file that works (no Docker engine here). It reads
the file (YAML anchors and merge keys, `${VAR:-default}` interpolation), and for each service
that is built from this repository (`build: .`; external images such as the collector are left
out) starts exactly its command and environment, with:
  - volumes: each service's container paths replaced by the local folder of the host path it mounts
    (`./runs:/runs` -> tmp/runs, `./certs/actor:/certs` -> tmp/certs/actor);
  - ports: `--host 0.0.0.0 --port N` -> 127.0.0.1 and a free port; `service:N` -> 127.0.0.1:port;
  - the image's working directory (/app) -> this checkout, `meshrl` -> this checkout's .venv/bin;
  - depends_on conditions: service_completed_successfully (waits for exit 0),
    service_healthy (runs the service's healthcheck until it passes), service_started.
"""

import os
import pathlib
import random
import re
import socket
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


class ComposeError(RuntimeError):
    pass


def interpolate(value, env: dict):
    if isinstance(value, str):
        return VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a port picked now and bound later by the service
    could meanwhile go to an outgoing connection or a port-0 listener (gloo's), which the kernel takes
    from that range (seen once in CI: "Address already in use")."""
    low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def load(paths: list[pathlib.Path], env: dict) -> dict:
    """The files' services built from this repository, interpolated with env; a later file's service
    merged into an earlier one's as Docker merges them (maps key by key, depends_on too; lists replaced)."""
    merged: dict = {}
    for path in paths:
        doc = interpolate(yaml.safe_load(path.read_text()), env)
        for name, s in (doc.get("services") or {}).items():
            into = merged.setdefault(name, {})
            for key, value in s.items():
                into[key] = {**into[key], **value} if isinstance(value, dict) and key in into else value
    services = {name: s for name, s in merged.items() if "build" in s and not s.get("profiles")}
    for name, s in services.items():
        if not isinstance(s.get("command"), list) or not s["command"]:
            raise ComposeError(f"service {name}: command must be a non-empty list")
    return services


class LocalCompose:
    def __init__(self, path: pathlib.Path | list[pathlib.Path], workdir: pathlib.Path, env: dict | None = None):
        self.services = load(path if isinstance(path, list) else [path], {**os.environ, **(env or {})})
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports = {}  # (service, container port) -> local port
        for name, s in self.services.items():
            cmd = s["command"]
            if "--port" in cmd:
                self.ports[(name, cmd[cmd.index("--port") + 1])] = str(free_port())
        self.volumes: dict[str, dict[str, str]] = {}  # service -> {container path: local folder}
        for name, s in self.services.items():
            for v in s.get("volumes") or []:
                host, container = v.split(":")[:2]
                self.volumes.setdefault(name, {})[container] = str(workdir / host.removeprefix("./").strip("/"))

    def _local(self, text: str, service: str) -> str:
        for (name, port), local in self.ports.items():
            text = text.replace(f"{name}:{port}", f"127.0.0.1:{local}")
            if name == service:
                text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{local}")
        for container, local in self.volumes.get(service, {}).items():
            if text == container or text.startswith(container + "/") or ("=" + container) in text:
                text = text.replace(container, local)
        return text

    def command(self, name: str, cmd: list[str]) -> list[str]:
        out = [self._local(str(a), name) for a in cmd]
        for i, a in enumerate(out[:-1]):
            if a == "--host":
                out[i + 1] = "127.0.0.1"
            if a == "--port":
                out[i + 1] = self.ports[(name, cmd[i + 1])]
        return out

    def environment(self, name: str) -> dict:
        env = dict(os.environ)
        env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env.get('PATH', '')}"
        for k, v in (self.services[name].get("environment") or {}).items():
            env[k] = self._local(str(v), name)
        return env

    def start(self, name: str) -> None:
        for c in self.volumes.get(name, {}).values():
            pathlib.Path(c).mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(
            self.command(name, self.services[name]["command"]),
            cwd=ROOT,
            env=self.environment(name),
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def log_tail(self, name: str, chars: int = 2000) -> str:
        return (self.workdir / f"{name}.log").read_text()[-chars:]

    def wait_done(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            raise ComposeError(f"service {name} did not finish in {timeout:.0f} s") from None

    def wait_healthy(self, name: str, timeout: float) -> None:
        check = self.services[name].get("healthcheck", {}).get("test")
        if not check:
            raise ComposeError(f"service {name} has no healthcheck for condition service_healthy")
        cmd = self.command(name, check[1:] if check[0] in ("CMD", "CMD-SHELL") else check)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise ComposeError(
                    f"service {name} exited with code {self.procs[name].returncode} before it was "
                    f"healthy; its log ends:\n{self.log_tail(name)}"
                )
            if subprocess.run(cmd, cwd=ROOT, env=self.environment(name), capture_output=True).returncode == 0:
                return
            time.sleep(1)
        raise ComposeError(f"service {name} not healthy after {timeout:.0f} s")

    def up(self, until: str, timeout: float = 600) -> int:
        """Start every service in dependency order; wait for `until` to exit and return its exit code."""
        started: set[str] = set()

        def bring_up(name: str, path: tuple = ()):
            if name in started:
                return
            if name in path:
                raise ComposeError(f"depends_on cycle: {' -> '.join(path + (name,))}")
            deps = self.services[name].get("depends_on") or {}
            deps = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
            for dep, spec in deps.items():
                if dep not in self.services:
                    raise ComposeError(f"service {name} depends on unknown service {dep}")
                bring_up(dep, path + (name,))
                condition = spec.get("condition", "service_started")
                if condition == "service_completed_successfully":
                    code = self.wait_done(dep, timeout)
                    if code != 0:
                        raise ComposeError(
                            f"service {dep} exited with code {code}; its log ends:\n{self.log_tail(dep)}"
                        )
                elif condition == "service_healthy":
                    self.wait_healthy(dep, timeout)
            self.start(name)
            started.add(name)

        for name in self.services:
            if name != until:
                bring_up(name)
        bring_up(until)
        return self.wait_done(until, timeout)

    def down(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
