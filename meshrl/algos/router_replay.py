"""Routing replay for a mixture of experts: a forward pass that uses given experts instead of routing afresh.

An MoE's rollout and trainer can pick different experts for the same token (kernels differ, and every
update moves the router), and the policy ratio then compares two different networks. Replay fixes the
choice: R3 (rollout routing replay, arXiv 2510.11370) replays the experts the rollout chose; R2 replays
the trainer's own first pass in the update's later passes (verl and slime name both so).

The choice is replaced in a forward hook on each router (meshrl/moe_facts.routers; most return (logits,
weights, experts), Llama-4's (scores, logits): meshrl/algos/moe.read): the weights become the router's own
weights of the replayed experts (softmax or sigmoid of their logits, renormalized and scaled as the
router does: moe.weight_rule), so the router still gets gradients for the experts it is given, as the
R3 paper does. A pass feeds the experts of the tokens it runs, in the order it runs them
(`RouterReplay.feed`), as (tokens, layers, top-k) integers; `record` collects what the routers chose.
Batches carry them as ROUTED, (rows, sequence, layers, top-k) beside input_ids, uint8 (int32 past 256
experts); where a token has
no choice to replay (padding, a response's last token) the row holds 0..k-1, which a replaying pass never
reads for a token whose output is used. GenerationRecord takes a generate's choices (the hf rollout's R3).
"""

import contextlib
from typing import Any, cast

import torch

from meshrl.algos import moe
from meshrl.algos.moe import routers
from meshrl.config.losses import ROUTED

__all__ = ["ROUTED", "RouterReplay", "GenerationRecord", "feed", "replay_of", "agreement", "filler", "dtype_for"]


def dtype_for(num_experts: int) -> torch.dtype:
    """How the experts travel: uint8 where every expert's index fits (up to 256 experts), else int32 (the
    wire has no int16)."""
    return torch.uint8 if num_experts <= 256 else torch.int32


def filler(shape: tuple[int, ...], k: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """(..., layers, k) holding 0..k-1: distinct experts, for tokens whose choice nothing reads."""
    return torch.arange(k, dtype=dtype).expand(*shape, k).clone()


def agreement(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of tokens (mask: (rows, sequence), 1 where compared) whose expert sets agree in every layer."""
    same = (a.long().sort(-1).values == b.long().sort(-1).values).all(-1).all(-1)
    picked = mask.bool()
    return float(same[picked].float().mean()) if picked.any() else 1.0


def in_backward() -> bool:
    """Whether this runs inside autograd's backward (gradient checkpointing runs forwards again there)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


class RouterReplay:
    """The hooks on one model's routers. feed(experts) makes the next passes route as given (None: afresh);
    with `recording` each router's choice of every pass is kept for take()."""

    def __init__(self, model: torch.nn.Module):
        self.routers = routers(model)
        self.experts: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None  # the fed tokens that are real (not padding)
        self.agreed = self.compared = 0  # (token, layer) choices that routing afresh would have made too
        self.recording = False
        self.observe = False  # compare with the fed experts, count, but route afresh (router_agreement)
        self.recorded: list[torch.Tensor] = []
        self.rules: dict[int, tuple[str, bool]] = {}  # each router's weights (moe.WEIGHTS), told by its first output
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._hook(layer))

    def _hook(self, layer: int):
        def replace(module, args, out):
            logits, weights, chosen = moe.read(module, out)
            if self.recording:
                self.recorded.append(chosen.detach())
            if self.experts is None:
                return None
            given = self.experts[:, layer].to(chosen.device, torch.long)
            if given.shape != chosen.shape:
                raise ValueError(
                    f"routing replay: the pass routes {list(chosen.shape)} (tokens, top-k) in layer {layer}, "
                    f"the replayed experts are {list(given.shape)}"
                )
            if self.valid is not None and not in_backward():  # a checkpointed recompute counts once, not twice
                same = (chosen.sort(-1).values == given.sort(-1).values).all(-1)[self.valid.to(chosen.device)]
                self.agreed, self.compared = self.agreed + int(same.sum()), self.compared + len(same)
            if self.observe:
                return None
            rule = self.rules.get(layer) or moe.weight_rule(module, out)
            if rule is None:  # no tokens: nothing to replay or to tell the router's rule by
                return None
            self.rules[layer] = rule
            return moe.written(out, moe.WEIGHTS[rule](module, logits, given), given)

        return replace

    def feed(self, experts: torch.Tensor | None, valid: torch.Tensor | None = None) -> None:
        """(tokens, layers, k) for the passes that follow, in their token order, and which of the tokens are
        real (for the agreement count); None: route afresh."""
        self.experts = None if experts is None else experts.reshape(-1, len(self.routers), experts.shape[-1])
        self.valid = None if valid is None else valid.reshape(-1).bool()

    def agreement(self) -> dict[str, float]:
        """The share of real tokens' choices (per layer) that routing afresh would have made as replayed,
        since the last call; {} if nothing was replayed."""
        share = self.agreed / self.compared if self.compared else None
        self.agreed = self.compared = 0
        return {} if share is None else {"actor/moe/routing_agreement": share}

    def take(self) -> torch.Tensor:
        """What the routers chose since the last take: (tokens, layers, k), one pass's tokens."""
        layers = len(self.routers)
        out = torch.stack(self.recorded[-layers:], 1) if self.recorded else torch.empty(0)
        self.recorded = []
        return out


def replay_of(model: torch.nn.Module) -> RouterReplay | None:
    """The model's RouterReplay, made on first use; None for a dense model (no routers)."""
    found = getattr(model, "_meshrl_router_replay", None)
    if found is None and routers(model):
        found = RouterReplay(model)
        object.__setattr__(model, "_meshrl_router_replay", found)  # an attribute, not a submodule
    return found


def feed(model: torch.nn.Module, micro: dict, pick) -> None:
    """Before a pass: the micro-batch's replayed experts (ROUTED) in the pass's token order, pick(tensor)
    being the same selection the pass makes of input_ids; a micro-batch without them routes afresh."""
    replay = replay_of(model) if ROUTED in micro else getattr(model, "_meshrl_router_replay", None)
    if replay is not None:
        given = ROUTED in micro
        replay.feed(pick(micro[ROUTED]) if given else None, pick(compared(micro["attention_mask"])) if given else None)


def compared(mask: torch.Tensor) -> torch.Tensor:
    """The tokens whose replayed choice the agreement counts: the real ones but each row's last, which the
    rollout never runs (R3 holds filler there) and whose output no log-prob reads."""
    out = mask.clone()
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    out[torch.arange(len(mask)), last] = 0
    return out


class GenerationRecord:
    """Within `with`, each forward of the model (a generate's prefill and decoding steps): the (rows, columns)
    of input_ids it ran and every router's choices, as calls() -> [(rows, columns, layers, k)]."""

    def __init__(self, model: torch.nn.Module):
        replay = replay_of(model)
        assert replay is not None, "a generation record needs a mixture of experts"
        self.model, self.replay = model, replay
        self.shapes: list[tuple[int, int]] = []
        self.handle: Any = None

    def _shape(self, module, args) -> None:
        self.shapes.append(tuple(args[0].shape))

    def __enter__(self) -> "GenerationRecord":
        self.replay.feed(None)
        self.replay.recorded, self.replay.recording = [], True
        # the embedding sees every forward's input_ids, whatever wraps the model (an adapter's, generate's)
        embeddings = cast(Any, self.model).get_input_embeddings()  # a transformers model's
        self.handle = embeddings.register_forward_pre_hook(self._shape)
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.remove()
        self.replay.recording = False
        if exc[0] is not None:  # an aborted generate: nothing to take
            self.replay.recorded = []

    @contextlib.contextmanager
    def aside(self):
        """Around a forward that is not one of the generation's own steps (its cache made again after a weight
        update, on_update=recompute): what it records is dropped."""
        shapes, recorded = len(self.shapes), len(self.replay.recorded)
        try:
            yield
        finally:
            del self.shapes[shapes:], self.replay.recorded[recorded:]

    def calls(self) -> list[torch.Tensor]:
        layers, got = len(self.replay.routers), self.replay.recorded
        assert len(got) == layers * len(self.shapes), "a forward without its routers' choices"
        self.replay.recorded = []
        return [
            torch.stack(got[i * layers : (i + 1) * layers], 1).view(*shape, layers, -1).cpu()
            for i, shape in enumerate(self.shapes)
        ]
