"""Which update losses each role may train with, and their parameters built from a request (the parameter
sets themselves live in meshrl/config/losses.py, where the run reads them too).

An UpdateRequest names the loss ("ppo", "dpo", "sft", "value") and its parameters; the service checks
names and types before any rank starts.
"""

from meshrl.config.losses import PARAMS
from meshrl.typed import build

LOSSES_BY_ROLE = {"actor": ("ppo", "dpo", "sft"), "critic": ("value",), "ref": ()}


def parse_loss(role: str, name: str, params: dict):
    allowed = LOSSES_BY_ROLE[role]
    if name not in PARAMS:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(PARAMS)}")
    if name not in allowed:
        raise ValueError(
            f"the {role} role does not train with loss {name!r}"
            + (f"; it takes {list(allowed)}" if allowed else "; it is frozen")
        )
    return build(PARAMS[name], params, f"loss {name}")
