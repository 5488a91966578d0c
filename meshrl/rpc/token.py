"""Where the mesh's bearer token comes from: the environment, never a command line (/proc/PID/cmdline
is readable by every user of the machine).

MESHRL_TOKEN holds the token, or MESHRL_TOKEN_FILE names a file holding it. Servers require it and
clients send it when it is set; the services an orchestrator starts inherit its environment, so one
export covers a whole run (orchestrator, services, the actor's weight push, `meshrl health`).
Where neither is set, a run makes a token of its own for the services it starts (run_token): an
anonymous caller on the same machine then cannot train, checkpoint or push weights. A token the run
made is never sent to a service given by address (that would hand a stranger the keys to the run's own
services): those are called without one (MESHRL_PEER_TOKEN="" tells the actor so for its weight push),
unless the user sets MESHRL_TOKEN, which then covers every service.
"""

import os
import pathlib
import secrets

VAR, FILE_VAR, PEER_VAR = "MESHRL_TOKEN", "MESHRL_TOKEN_FILE", "MESHRL_PEER_TOKEN"


def env_token() -> str | None:
    """The token from MESHRL_TOKEN or the file MESHRL_TOKEN_FILE names; None when neither is set."""
    if os.environ.get(VAR):
        return os.environ[VAR]
    path = os.environ.get(FILE_VAR)
    if not path:
        return None
    try:
        token = pathlib.Path(path).read_text().strip()
    except OSError as e:
        raise ValueError(f"{FILE_VAR}={path}: cannot read the token file ({e.strerror})") from None
    if not token:
        raise ValueError(f"{FILE_VAR}={path}: the token file is empty")
    return token


def peer_token() -> str | None:
    """The token a service sends on its own calls to other services (the actor's weight push):
    MESHRL_PEER_TOKEN when set ("" sends none), else the service's own."""
    peer = os.environ.get(PEER_VAR)
    return peer if peer is not None else env_token()


def run_token() -> bool:
    """A random token in this process's environment (which the services it starts inherit; only its own
    user can read /proc/PID/environ) unless one is set; True when it made one (drop it with
    forget_run_token when the run ends)."""
    if env_token() is not None:
        return False
    os.environ[VAR] = secrets.token_urlsafe(32)
    return True


def forget_run_token() -> None:
    os.environ.pop(VAR, None)
    os.environ.pop(PEER_VAR, None)
