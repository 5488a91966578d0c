"""Which update losses each role may train with, and their parameters built from a request (the losses
themselves are one table, meshrl/config/losses.py UPDATE_LOSSES, which the run reads too).

An UpdateRequest names the loss ("ppo", "dpo", "sft", "value") and its parameters; the service checks
names and types before any rank starts.
"""

from meshrl.config.losses import UPDATE_LOSSES
from meshrl.typed import build


def parse_loss(role: str, name: str, params: dict):
    allowed = [n for n, loss in UPDATE_LOSSES.items() if loss.role == role]
    if name not in UPDATE_LOSSES:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(UPDATE_LOSSES)}")
    if name not in allowed:
        raise ValueError(
            f"the {role} role does not train with loss {name!r}"
            + (f"; it takes {allowed}" if allowed else "; it is frozen")
        )
    return build(UPDATE_LOSSES[name].params, params, f"loss {name}")
