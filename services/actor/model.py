"""The per-token quantities the roles need from a forward pass (models are built by meshrl.models).

The batch layout is verl's: input_ids = left-padded prompt + right-padded
response, so the logits that predict response token t sit at position
L - T - 1 + t (T = response length, L = sequence length). A model set up for padding-free passes
(actor.padding_free) runs each micro-batch packed instead (services/actor/packing.py), its shared
prompts once in the same packed row.
"""

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

from meshrl.algos import router_replay
from meshrl.modalities import vision
from services.actor import packing, sequence


@dataclasses.dataclass
class Seen:
    """A micro-batch's pictures as a vision-language model's forward takes them: its rows' three-axis
    positions (3, rows, L; Qwen2-VL's multimodal rotary positions), pixel_values with image_grid_thw, and
    where the pictures go: the image tokens of the prompts (rows, L). A response may hold the image token
    too (a policy can sample it); the rollout ran it as a token, so the actor does."""

    positions: torch.Tensor
    inputs: dict
    places: torch.Tensor
    core: torch.nn.Module
    blank: bool = False  # the one blank picture of a micro-batch without any (model.blank)

    def only(self, rows: torch.Tensor, micro: dict) -> "Seen":
        """The pictures of these rows alone, in their order (a packed pass with shared prompts holds each
        distinct prompt once); positions and places stay every row's."""
        if self.blank:
            return self
        pixels, grid = vision.unstack(micro["pixel_values"][rows], micro["image_grid_thw"][rows])
        return dataclasses.replace(self, inputs={"pixel_values": pixels, "image_grid_thw": grid})

    @contextlib.contextmanager
    def placed(self, places: torch.Tensor):
        """The model's forward puts the pictures at `places` (its own input_ids' layout), not at every image
        token: transformers' Qwen2-VL finds them by the token alone (get_placeholder_mask)."""

        def mask(input_ids, inputs_embeds, image_features=None, video_features=None):
            image = places.reshape(inputs_embeds.shape[:-1])[..., None].expand_as(inputs_embeds)
            return image.to(inputs_embeds.device), torch.zeros_like(image)

        self.core.get_placeholder_mask = mask  # type: ignore[assignment]  # this instance, for this call
        try:
            yield
        finally:
            del self.core.get_placeholder_mask


def pictures(model: torch.nn.Module, micro: dict) -> Seen | None:
    """The micro-batch's pictures (the row tensors meshrl.modalities.vision.stack makes), None where it has none.

    Positions: Qwen2-VL's get_rope_index (a loop over rows) runs on each distinct prompt once; a response
    continues as text does after it, one past the prompt's largest position on all three axes."""
    if "pixel_values" not in micro:
        return None
    core = next((m for m in model.modules() if hasattr(m, "get_rope_index")), None)
    if core is None:
        raise ValueError(f"the batch has pictures, but {type(model).__name__} is not a vision-language model")
    if sequence.of(model) is not None:
        raise ValueError("actor.sequence_parallel does not take pictures yet")
    grids = micro["image_grid_thw"]
    if not bool((grids.prod(-1) > 0).any()):
        return blank(core, micro)
    ids, mask = micro["input_ids"], micro["attention_mask"]
    T = micro["responses"].shape[1]
    P = ids.shape[1] - T
    places = F.pad(ids[:, :P] == core.config.image_token_id, (0, T))  # type: ignore[union-attr]
    inverse = prompt_index(micro, T)
    first = torch.full((int(inverse.max()) + 1,), len(inverse), device=ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(len(inverse), device=ids.device), "amin")
    get_rope_index = cast(Callable, core.get_rope_index)
    prompts, _ = get_rope_index(
        ids[first, :P],
        mm_token_type_ids=places[first, :P].int(),
        image_grid_thw=vision.unstack(micro["pixel_values"][first], grids[first])[1],
        attention_mask=mask[first, :P],
    )
    after = prompts.masked_fill(~mask[first, :P].bool(), -1).amax((0, 2)) + 1  # each prompt's next position
    responses = (after[:, None] + torch.arange(T, device=ids.device))[None].expand(3, -1, -1)
    positions = torch.cat([prompts, responses], 2)[:, inverse]
    pixels, grid = vision.unstack(micro["pixel_values"], grids)
    return Seen(positions, {"pixel_values": pixels, "image_grid_thw": grid}, places, core)


def blank(core: torch.nn.Module, micro: dict) -> Seen:
    """A micro-batch without pictures in a batch with some: the tower still runs, on one blank picture that
    goes nowhere (its features are scattered to no token, its gradients are zeros), so that every FSDP rank
    gathers and reduces the tower's weights as the others do (a rank skipping it would hang the rest)."""
    config: Any = core.config
    vision_config = config.vision_config
    merge = int(vision_config.spatial_merge_size)
    width = int(vision_config.in_channels * vision_config.temporal_patch_size * vision_config.patch_size**2)
    ids = micro["input_ids"]
    pixels = torch.zeros(merge * merge, width, dtype=micro["pixel_values"].dtype, device=ids.device)
    grid = torch.tensor([[1, merge, merge]], device=ids.device)
    positions = micro["position_ids"][None].expand(3, -1, -1)
    return Seen(
        positions, {"pixel_values": pixels, "image_grid_thw": grid}, torch.zeros_like(ids, dtype=torch.bool), core
    )


def forward_response(
    model: torch.nn.Module, micro: dict, response_length: int | None = None, share_prompts: bool = False
) -> torch.Tensor:
    """Model outputs at the positions that predict each response token: (B, T, V) or (B, T, 1); T is the
    micro-batch's own response width unless given.

    share_prompts (causal LMs only): rows with the same prompt (a GRPO group's n samples, a DPO pair) run
    it once, and their responses attend to its cached keys and values (Prefix Grouper, arXiv:2506.05433).
    Causal attention makes a prompt's states independent of what follows, so the outputs are the same
    and the gradients sum over the rows, as the full pass's do; the prompt's share of the compute falls by
    the number of rows that share it. A causal LM also computes its head only where it is read."""
    T = micro["responses"].shape[1] if response_length is None else response_length
    flat = packed(model)
    seen = pictures(model, micro)
    # the padded shared pass needs HF's cache, which gradient checkpointing drops; the packed one has none.
    # With pictures, the packed one alone: each distinct prompt's pictures are encoded once
    cached = not getattr(model, "is_gradient_checkpointing", False) and seen is None
    if share_prompts and (flat or cached):
        shared = prompt_sharing(micro, T)
        if shared is not None and flat:
            once = seen.only(shared[0], micro) if seen is not None else None
            return packing.forward_packed_shared(model, micro, T, *shared, seen=once)
        if shared is not None:
            return forward_shared(model, micro, T, *shared)
    if flat:
        return packing.forward_packed(model, micro, T, head_only_where_read=share_prompts, seen=seen)
    kw = {"logits_to_keep": T + 1} if share_prompts else {}
    router_replay.feed(model, micro, lambda r: r)
    with seen.placed(seen.places) if seen is not None else contextlib.nullcontext():
        out = model(
            input_ids=micro["input_ids"],
            attention_mask=micro["attention_mask"],
            position_ids=micro["position_ids"] if seen is None else seen.positions,
            use_cache=False,
            **kw,
            **(seen.inputs if seen is not None else {}),
        )
    return out.logits[:, -T - 1 : -1]


def packed(model: torch.nn.Module) -> bool:
    """The model runs padding-free passes (actor.padding_free: services/actor/packing.py)."""
    return getattr(model_config(model), "_attn_implementation", None) == packing.NAME


def model_config(model: torch.nn.Module):
    return getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)


def prompt_sharing(micro: dict, T: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(one row of each distinct prompt, each row's index into those), or None when too few rows share
    one for a second pass to pay (fewer than a quarter of the prompts saved)."""
    inverse = prompt_index(micro, T)
    rows, distinct = len(inverse), int(inverse.max()) + 1
    if distinct * 4 > rows * 3:
        return None
    first = torch.full((distinct,), rows, device=inverse.device).scatter_reduce(
        0, inverse, torch.arange(rows, device=inverse.device), "amin"
    )
    return first, inverse


def prompt_index(tensors: dict, T: int) -> torch.Tensor:
    """Each row's prompt (ids, mask and positions before the last T columns, and its pictures: the same
    question about another picture is another prompt) as an index into the distinct ones."""
    P = tensors["input_ids"].shape[1] - T
    key = torch.cat([tensors[k][:, :P] for k in ("input_ids", "attention_mask", "position_ids")], 1)
    if "picture_set" in tensors:
        key = torch.cat([key, tensors["picture_set"][:, None].to(key.dtype)], 1)
    return torch.unique(key, dim=0, return_inverse=True)[1]


def forward_shared(
    model: torch.nn.Module, micro: dict, T: int, first: torch.Tensor, inverse: torch.Tensor
) -> torch.Tensor:
    ids, mask, pos = micro["input_ids"], micro["attention_mask"], micro["position_ids"]
    P = ids.shape[1] - T
    router_replay.feed(model, micro, lambda r: r[first, :P])
    prompt = model(
        input_ids=ids[first, :P],
        attention_mask=mask[first, :P],
        position_ids=pos[first, :P],
        use_cache=True,
        logits_to_keep=1,
    )
    last = prompt.logits[inverse]  # the last prompt position predicts the first response token
    if T == 1:
        return last
    cache = prompt.past_key_values
    cache.batch_select_indices(inverse)  # an indexing op: the gradient flows back to the shared prompt
    router_replay.feed(model, micro, lambda r: r[:, P:-1])
    rest = model(
        input_ids=ids[:, P:-1],
        attention_mask=mask[:, :-1],
        position_ids=pos[:, P:-1],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([last, rest.logits], 1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature): (B, T, V), (B, T) -> (B, T), in fp32."""
    return logprobs_and_entropy(logits, tokens, temperature, False)[0]


def logprobs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_logprobs, and the entropy of softmax(logits / temperature) at each position if asked (one
    log_softmax serves both)."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    lp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return lp, (-(logp.exp() * logp).sum(-1) if entropy else None)


@torch.no_grad()
def record_routing(model: torch.nn.Module, micro: dict) -> torch.Tensor:
    """(rows, sequence, layers, k): the experts a mixture of experts' routers choose for each token of the
    micro-batch, each row routed on its own (no prompt sharing: every row's prompt gets its choices);
    padding holds router_replay.filler."""
    replay = router_replay.replay_of(model)
    assert replay is not None, "record_routing needs a mixture of experts"
    micro = {k: v for k, v in micro.items() if k != router_replay.ROUTED}  # routed afresh
    ids = micro["input_ids"]
    flat = packed(model)
    replay.recording = True
    try:  # the routers are what is wanted: the head runs nowhere (packed), or once a row
        if flat:
            packing.forward_packed(model, micro, micro["responses"].shape[1], True, outputs=False)
        else:
            router_replay.feed(model, micro, lambda r: r)  # none in micro: routes afresh
            model(
                input_ids=ids,
                attention_mask=micro["attention_mask"],
                position_ids=micro["position_ids"],
                use_cache=False,
                logits_to_keep=1,
            )
        chosen = replay.take()
        shards = sequence.of(model)
        if flat and shards is not None:  # this rank's slice of the packed row: the group's, in order
            chosen = shards.gather(chosen)[: int(micro["attention_mask"].sum())]
    finally:
        replay.recording = False
    dtype = router_replay.dtype_for(cast(int, replay.routers[0].num_experts))  # an int on every router
    out = router_replay.filler((*ids.shape, len(replay.routers)), chosen.shape[-1], dtype)
    real = micro["attention_mask"].bool() if flat else torch.ones_like(ids).bool()
    out[real.cpu()] = chosen.cpu().to(out.dtype)
    return out
