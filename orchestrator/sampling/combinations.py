"""What each way of sampling cannot be combined with: read from the samplers' own declarations (a step
sampler's `refuses`, the episode samplers' episodes.REFUSES), checked in one place before anything starts
(every loop's setup calls check), and written as a table into docs/configuration.md (describe).

A way is on when its setting says so; a loop that samples no steps (dpo samples single answers without
carrying them, sft samples nothing) is a way too, so a sampler can refuse it.
"""

import dataclasses
from collections.abc import Callable

from meshrl.config.rollout import IN_FLIGHT
from orchestrator.config import Config
from orchestrator.sampling import episodes
from orchestrator.sampling.dynamic import Dynamic
from orchestrator.sampling.partial import Partial
from orchestrator.sampling.pipeline import Ahead

SAMPLING_LOOPS = ("ppo", "grpo", "rloo", "reinforce", "opd")  # the loops that sample steps ahead or in rounds


@dataclasses.dataclass(frozen=True)
class Way:
    name: str
    key: str  # the setting that turns it on, as a refusal names it
    on: Callable[[Config, str], object]  # (the run's config, its loop) -> on when true
    refuses: dict[str, str] = dataclasses.field(default_factory=dict)  # way -> why, as its sampler declares


WAYS = (
    Way("chunks", "rollout.chunks", lambda c, _: c.rollout.chunks > 1),
    Way("environment episodes", "rollout.multi_turn", lambda c, _: c.rollout.multi_turn, episodes.REFUSES),
    Way("agent episodes", "rollout.agent", lambda c, _: c.rollout.agent or c.rollout.agent_command, episodes.REFUSES),
    Way(
        "sampling ahead",
        "trainer.max_staleness",
        lambda c, _: c.trainer.max_staleness > 0 and not c.rollout.partial,
        Ahead.refuses,
    ),
    Way("partial rollouts", "rollout.partial=true", lambda c, _: c.rollout.partial, Partial.refuses),
    Way("dynamic sampling", "algorithm.dynamic_sampling", lambda c, _: c.algorithm.dynamic_sampling, Dynamic.refuses),
    # settings and loops a way may refuse
    Way(
        "rollout experts",
        "actor.router_replay=r3 (or actor.router_agreement=true)",
        lambda c, _: c.actor.rollout_experts(),
    ),
    Way("colocate", "rollout.colocate", lambda c, _: c.rollout.colocate),
    Way("updates in flight", "rollout.on_update", lambda c, _: c.rollout.on_update in IN_FLIGHT),
    Way("dpo", "meshrl dpo", lambda _, loop: loop == "dpo"),
    Way("sft", "meshrl sft", lambda _, loop: loop == "sft"),
)
BY_NAME = {w.name: w for w in WAYS}


def check(cfg: Config, algorithm: str) -> None:
    """The first pair of ways on together that one of them refuses, as a one-line ValueError."""
    on = [w for w in WAYS if w.on(cfg, algorithm)]
    for way in on:
        for other, why in way.refuses.items():
            if BY_NAME[other] in on:
                loops = ", ".join(SAMPLING_LOOPS)
                text = why.format(key=way.key, other=BY_NAME[other].key, cfg=cfg, algorithm=algorithm, loops=loops)
                raise ValueError(text)


def describe() -> str:
    """The table of what cannot be combined, for docs/configuration.md."""
    rows = ["| way | turned on by | cannot be combined with |", "|---|---|---|"]
    for way in WAYS:
        refused = [w.name for w in WAYS if way.name in w.refuses or w.name in way.refuses]
        rows.append(f"| {way.name} | `{way.key}` | {', '.join(refused) or '(any)'} |")
    return "\n".join(rows) + "\n"
