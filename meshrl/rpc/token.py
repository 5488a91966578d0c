"""Where the mesh's bearer token comes from: the environment, never a command line (/proc/PID/cmdline
is readable by every user of the machine).

MESHRL_TOKEN holds the token, or MESHRL_TOKEN_FILE names a file holding it. Servers require it and
clients send it when it is set; the services an orchestrator starts inherit its environment, so one
export covers a whole run (orchestrator, services, the actor's weight push, `meshrl health`).
"""

import os
import pathlib

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
