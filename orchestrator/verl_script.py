"""A verl launch script's verl command, for `meshrl config from-verl`: the settings it is given
(`python3 -m verl.trainer.main_ppo key=value ...`), in the forms verl ships its examples in (settings in
variables and arrays, `${VAR:-default}`, `if`/`case` on a variable), as Hydra reads them.

    overrides, unread, assumed = read_script(text)   # {"actor_rollout_ref.rollout.n": 16, ...},
                                                      # {key: (as written, why)}, [what the reading took]

The script is read as bash would run it up to its first verl command (orchestrator/shell.py: with no
arguments, with the environment empty, nothing run); each word after the module is a Hydra override:
`key=value` (a leading `+` dropped, the value read as YAML's scalars and flow lists, as Hydra does),
`--config-name=...` and the like are listed as Hydra options. A setting whose value needs the shell (a
command's output, a variable only the environment gives) comes back in `unread` with the reason
(orchestrator/from_verl.py leaves out a path, refuses a training setting); where it is not known which
settings a word gives (`$ARGS` unknown, `"${EXTRA[@]}"` changed under a branch not known here), or the
verl command runs only under such a branch, the script is refused here (ValueError) in one line naming
what could not be read.
"""

import yaml

from orchestrator.config import read_yaml
from orchestrator.shell import Shell
from orchestrator.shell_syntax import short
from orchestrator.shell_words import Field
from orchestrator.verl_keys import ENTRY_POINTS


def is_script(text: str) -> bool:
    return any(entry in text for entry in ENTRY_POINTS)


def hydra_value(text: str) -> object:
    """A command-line value as Hydra reads it: YAML's scalars and flow lists (True, 1e-6 a float, null,
    ["console","wandb"]); '' for an empty value."""
    if not text:
        return ""
    if text.lower() in ("yes", "no", "on", "off", "y", "n"):  # YAML 1.1's booleans, Hydra's strings
        return text
    try:
        return read_yaml(text)
    except yaml.YAMLError:
        return text


def settings(fields: list[Field], line: int) -> tuple[dict[str, object], dict[str, tuple[str, str]]]:
    """({verl key: value}, {key: (as written, why it is not read)}) of the verl command's words after its
    module; ValueError where which keys a word sets is not known here."""
    overrides: dict[str, object] = {}
    unread: dict[str, tuple[str, str]] = {}
    for f in fields:
        eq = next((k for k, c in enumerate(f.text) if c == "=" and not any(a <= k < b for a, b, _ in f.lacks)), -1)
        if any(eq < 0 or a < eq for a, _, _ in f.lacks):
            why = "; ".join(dict.fromkeys(w for a, _, w in f.lacks if eq < 0 or a < eq))
            raise ValueError(f"line {line}: which verl settings `{short(f.text)}` gives needs {why}")
        key, value = (f.text[:eq], f.text[eq + 1 :]) if eq >= 0 else (f.text, "")
        key = key.lstrip("+")
        if key.startswith("-"):
            unread[key] = (value, "a Hydra option: verl's ppo_trainer config is assumed underneath")
        elif eq < 0 or key.startswith("~"):
            unread[f.text] = (f.text, "not a key=value setting: give it to meshrl as section.key=value")
        elif f.lacks:
            unread[key] = (value, f"needs the shell ({f.why()})")
            overrides.pop(key, None)
        else:
            overrides[key] = hydra_value(value)
            unread.pop(key, None)
    return overrides, unread


def read_script(text: str) -> tuple[dict[str, object], dict[str, tuple[str, str]], list[str]]:
    """({verl key: value} as the script's first verl command sets them, {key: (as written, why it is not
    read)}, [what the reading took: the script's defaults for what the environment would set, ...])."""
    shell = Shell(ENTRY_POINTS, "its verl command")
    reached = shell.reach(text)
    if reached is None:
        raise ValueError(f"no verl command ({' or '.join(ENTRY_POINTS)}) in the script")
    overrides, unread = settings(*reached)
    return overrides, unread, shell.taken()
