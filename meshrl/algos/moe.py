"""A mixture of experts' router terms in an update: the load-balancing loss (Switch Transformer, Fedus et
al. 2021, eq. 4-6: E * sum_e f_e P_e, f_e the tokens routed to expert e over all tokens (top-k: they sum
to k) and P_e its mean router probability, over every MoE layer's tokens; k when balanced; transformers'
own load_balancing_loss_func computes it), the router z-loss (ST-MoE, Zoph et al. 2022: the mean of
logsumexp(router logits)^2, which keeps the logits small), and each layer's expert load (tokens per
expert, max over mean: 1 when balanced).

The router outputs come from forward hooks on the model's routers (RouterCapture; found by where they sit,
meshrl/moe_facts.routers), so every forward path (padded, padding-free, shared prompts) feeds them
without returning them. Most of transformers' routers return (logits, weights, experts); Llama-4's
returns (scores, logits), scores holding the chosen experts' weights and 0 elsewhere: `read` and
`written` take both. A router's weights are one of a few functions of its logits (`WEIGHTS`: softmax or
sigmoid of the chosen logits, renormalized or not, scaled), which routing replay recomputes for the
experts it is given; `weight_rule` finds the one that gives the router's own weights of its own choice.
"""

import sys
from collections.abc import Callable
from typing import cast

import torch

from meshrl.moe_facts import routers


def read(router: torch.nn.Module, out) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A router's output as (logits (tokens, E), weights (tokens, k), experts (tokens, k))."""
    if len(out) == 3:
        return out[0], out[1], out[2]
    scores, logits = out  # Llama-4: its choice is the top-k of its logits, made again here
    chosen = torch.topk(logits, int(router.top_k), dim=-1).indices  # type: ignore[arg-type]  # an int attribute
    return logits, scores.gather(-1, chosen), chosen


def written(out, weights: torch.Tensor, experts: torch.Tensor):
    """The router's output `out` with `experts` chosen at `weights` instead."""
    if len(out) == 3:
        return out[0], weights.to(out[1].dtype), experts
    scores, logits = out
    return torch.zeros_like(scores).scatter(-1, experts, weights.to(scores.dtype)), logits


def activated(kind: str, normalized: bool):
    """A router's weights of `experts` from its logits: softmax over all experts or sigmoid per expert, of
    the chosen ones, renormalized over them or not, times the router's routed_scaling_factor (DeepSeek-V3's;
    1 elsewhere)."""

    def weights(router: torch.nn.Module, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(logits.float(), -1) if kind == "softmax" else torch.sigmoid(logits.float())
        chosen = scores.gather(-1, experts)
        if normalized:  # ERNIE-4.5 clamps the sum at norm_min; DeepSeek-V3 adds 1e-20
            total = chosen.sum(-1, keepdim=True)
            floor = getattr(router, "norm_min", None)
            chosen = chosen / (total.clamp(min=float(floor)) if floor is not None else total + 1e-20)
        return chosen * float(getattr(router, "routed_scaling_factor", 1.0))

    return weights


WEIGHTS = {
    (kind, normalized): activated(kind, normalized) for kind in ("softmax", "sigmoid") for normalized in (True, False)
}


@torch.no_grad()  # a checkpointed recompute, which knows the rule by then, must save what the first pass did
def weight_rule(router: torch.nn.Module, out) -> tuple[str, bool] | None:
    """The WEIGHTS key whose weights of the router's own choice are its own weights (a router that names
    norm_topk_prob is held to it); None for an output of no tokens (nothing to tell by). ValueError where
    none is: its experts cannot be replayed with the weights it would give them."""
    logits, weights, chosen = read(router, out)
    if not len(chosen):
        return None
    said = getattr(router, "norm_topk_prob", None)
    for key, rule in WEIGHTS.items():
        if said is not None and key[1] != bool(said):
            continue
        if torch.allclose(rule(router, logits, chosen), weights.float(), rtol=1e-2, atol=1e-4):
            return key
    raise ValueError(
        f"routing replay: {type(router).__name__}'s weights are none of softmax or sigmoid of its chosen logits "
        "(renormalized or not): its experts cannot be replayed"
    )


class RouterCapture:
    """Within `with`, each router's (logits, chosen experts) of every forward, in `outputs`; clear() between
    micro-batches (a checkpointed backward runs the forwards again)."""

    def __init__(self, model: torch.nn.Module, whole: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.routers = routers(model)
        self.outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.handles: list = []
        self.whole = whole  # a pass split over ranks (sequence parallelism): its slice -> the whole row's

    def _hook(self, module, args, out) -> None:
        logits, _, chosen = read(module, out)
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


def balance_loss(outputs: list, router: torch.nn.Module) -> torch.Tensor | None:
    """transformers' load-balancing loss of the captured layers (the router's own model module's function);
    None for a family without one (DeepSeek-V3, GLM-4.5, dots1, Hunyuan, Llama-4)."""
    fn = getattr(sys.modules[type(router).__module__], "load_balancing_loss_func", None)
    if fn is None:
        return None
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
    if aux is None and aux_coef:
        raise ValueError(
            f"actor.router_aux_loss_coef={aux_coef}: {type(router).__name__}'s model has no load-balancing loss "
            "(it balances its experts otherwise, e.g. DeepSeek-V3's correction bias); set it to 0"
        )
    metrics = {
        **(
            {} if aux is None else {"actor/moe/aux_loss": float(aux.detach()) if isinstance(aux, torch.Tensor) else aux}
        ),
        "actor/moe/z_loss": z.item(),
        **expert_load(capture.outputs, cast(int, router.num_experts)),  # an int attribute of every router
    }
    return (0.0 if aux is None else aux_coef * aux) + z_coef * z, metrics
