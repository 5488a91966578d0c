"""Where the mesh's bearer token comes from: the environment, never a command line (/proc/PID/cmdline
is readable by every user of the machine).

MESHRL_TOKEN holds the token, or MESHRL_TOKEN_FILE names a file holding it. Servers require it and
clients send it when it is set; the services an orchestrator starts inherit its environment, so one
export covers a whole run (orchestrator, services, the actor's weight push, `meshrl health`).
Where neither is set and a run starts every service itself, it makes a token of its own (run_token):
an anonymous caller on the same machine then cannot train, checkpoint or push weights.
"""

import os
import pathlib
import secrets

VAR, FILE_VAR = "MESHRL_TOKEN", "MESHRL_TOKEN_FILE"


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
