"""A mixture of experts' router terms in an update: the load-balancing loss (Switch Transformer, Fedus et
al. 2021, eq. 4-6: E * sum_e f_e P_e, f_e the tokens routed to expert e over all tokens (top-k: they sum
to k) and P_e its mean router probability, over every MoE layer's tokens; k when balanced; transformers'
own load_balancing_loss_func computes it), the router z-loss (ST-MoE, Zoph et al. 2022: the mean of
logsumexp(router logits)^2, which keeps the logits small), and each layer's expert load (tokens per
expert, max over mean: 1 when balanced).

The router outputs come from forward hooks on the model's routers (RouterCapture), so every forward path
(padded, padding-free, shared prompts) feeds them without returning them: transformers' routers
(Qwen3MoeTopKRouter, MixtralTopKRouter, Qwen2MoeTopKRouter, ...) return (logits, weights, experts).
"""

import sys
from collections.abc import Callable
from typing import cast

import torch


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers, in layer order; [] for a dense model."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


class RouterCapture:
    """Within `with`, each router's (logits, chosen experts) of every forward, in `outputs`; clear() between
    micro-batches (a checkpointed backward runs the forwards again)."""

    def __init__(self, model: torch.nn.Module, whole: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.routers = routers(model)
        self.outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.handles: list = []
        self.whole = whole  # a pass split over ranks (sequence parallelism): its slice -> the whole row's

    def _hook(self, module, args, out) -> None:
        logits, chosen = out[0], out[2]
        if self.whole is not None:
            logits, chosen = self.whole(logits), self.whole(chosen)
        self.outputs.append((logits, chosen))

    def clear(self) -> None:
        self.outputs.clear()

    def __enter__(self) -> "RouterCapture":
        self.handles = [r.register_forward_hook(self._hook) for r in self.routers]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles, self.outputs = [], []


def balance_loss(outputs: list, router: torch.nn.Module) -> torch.Tensor:
    """transformers' load-balancing loss of the captured layers (the router's own model module's function)."""
    fn = sys.modules[type(router).__module__].load_balancing_loss_func
    return fn(tuple(logits for logits, _ in outputs), router.num_experts, router.top_k)


def z_loss(outputs: list) -> torch.Tensor:
    """Mean over layers and tokens of logsumexp(logits)^2."""
    return torch.stack([torch.logsumexp(logits.float(), -1).pow(2).mean() for logits, _ in outputs]).mean()


def expert_load(outputs: list, num_experts: int) -> dict[str, float]:
    """Tokens per expert, max over mean, per layer: its mean over layers and the worst layer's."""
    ratios = []
    for _, experts in outputs:
        counts = torch.bincount(experts.reshape(-1), minlength=num_experts).float()
        ratios.append((counts.max() / counts.mean().clamp(min=1e-9)).item())
    return {
        "actor/moe/load_max_over_mean": sum(ratios) / len(ratios),
        "actor/moe/load_max_over_mean_worst": max(ratios),
    }


def router_terms(capture: RouterCapture, aux_coef: float, z_coef: float) -> tuple[torch.Tensor | float, dict]:
    """(what to add to the loss, metrics) from the captured forward of one micro-batch; (0.0, {}) if none."""
    if not capture.outputs:
        return 0.0, {}
    router = capture.routers[0]
    aux, z = balance_loss(capture.outputs, router), z_loss(capture.outputs)
    metrics = {
        "actor/moe/aux_loss": float(aux.detach()) if isinstance(aux, torch.Tensor) else float(aux),
        "actor/moe/z_loss": z.item(),
        **expert_load(capture.outputs, cast(int, router.num_experts)),  # an int attribute of every router
    }
    return aux_coef * aux + z_coef * z, metrics
