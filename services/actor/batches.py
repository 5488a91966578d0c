"""Checking an incoming batch, splitting it over the ranks, and into mini- and micro-batches.

Checks run on rank 0 before any rank starts, so a bad request never leaves the
group half-way through a collective. Rows added to make the batch divide over
the ranks get a zero response_mask: they take part in the forward passes (every
rank must run the same number) but add nothing to a loss.

Micro-batches are either a fixed number of rows (micro_batch_size) or, with a
token budget (micro_batch_tokens, verl's dynamic batch size), rows of similar
length grouped so that rows x width stays within the budget, each micro-batch
cut to its own longest prompt and response: the columns cut are padding in every
row of it, so the valid tokens' outputs are those of the full width.
"""

import math

import torch

from meshrl.algos.router_replay import ROUTED
from meshrl.dataproto import DataProto, pad_to_divisor
from meshrl.errors import InvalidArgument
from meshrl.modalities import ROW_TENSORS
from meshrl.moe_facts import facts
from services.actor.model import prompt_index

SEQUENCE = ("input_ids", "attention_mask", "position_ids")
BASE = (*SEQUENCE, "responses")
ALIGNED = (*SEQUENCE, ROUTED)  # (rows, sequence, ...) column for column with input_ids


def validate(
    data: DataProto,
    required: tuple[str, ...],
    world_size: int,
    *,
    pairs: bool = False,
    vocab_size: int | None = None,
    positions: int | None = None,
    experts: tuple[int, int, int] | None = None,
) -> None:
    """Refuse a batch the model cannot take, naming the tensor: missing, misshapen, non-finite, token ids
    or positions that are not integers, or past the vocabulary or what the model encodes (an index error
    inside a rank)."""
    missing = [k for k in required if k not in data.batch]
    if missing:
        raise InvalidArgument(f"missing tensor(s) {missing}; the batch has {sorted(data.batch)}")
    n = len(data)
    if n < world_size:
        raise InvalidArgument(f"a batch of {n} rows cannot be split over {world_size} ranks")
    if pairs and n % 2:
        raise InvalidArgument(f"a DPO batch holds (chosen, rejected) row pairs; {n} rows is odd")
    check_sequences(data)
    L, T = data.batch["input_ids"].shape[1], data.batch["responses"].shape[1]
    for k in SEQUENCE[1:]:
        if tuple(data.batch[k].shape) != (n, L):
            raise InvalidArgument(f"tensor {k!r} must be {[n, L]} like input_ids, got {list(data.batch[k].shape)}")
    for k in ("responses", "position_ids"):  # indices (gather, embeddings): a float fails inside a rank
        if data.batch[k].dtype not in (torch.int64, torch.int32):
            raise InvalidArgument(f"tensor {k!r} must hold integers (int64 or int32), got {data.batch[k].dtype}")
    for k, limit in (("input_ids", vocab_size), ("responses", vocab_size), ("position_ids", positions)):
        t = data.batch[k]
        if limit and t.numel() and not (0 <= int(t.min()) and int(t.max()) < limit):
            raise InvalidArgument(
                f"tensor {k!r} holds values outside 0..{limit - 1} "
                f"({'the vocabulary' if k != 'position_ids' else 'the positions the model encodes'})"
            )
    if ROUTED in data.batch:
        check_routed(data.batch[ROUTED], (n, L), experts)
    for k in required:
        if k in BASE or k == ROUTED:
            continue
        t = data.batch[k]
        if tuple(t.shape) != (n, T):
            raise InvalidArgument(f"tensor {k!r} must be {[n, T]} like responses, got {list(t.shape)}")
        if t.is_floating_point() and not torch.isfinite(t).all():
            row = int(torch.nonzero(~torch.isfinite(t))[0, 0])
            raise InvalidArgument(f"tensor {k!r} has NaN or inf (first at row {row})")


def check_sequences(data: DataProto) -> None:
    """input_ids (B, L) integers and responses (B, T) with 0 < T < L, each where the batch holds it: the
    servicer cuts the prompts (input_ids' first L - T columns) out before the rest is checked, and a 1-D
    tensor there was an IndexError (INTERNAL) instead of the caller's mistake."""
    ids, responses = data.batch.get("input_ids"), data.batch.get("responses")
    if ids is not None and (ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32)):
        raise InvalidArgument(f"tensor 'input_ids' must be (B, L) integers, got {ids.dtype} {list(ids.shape)}")
    if responses is None:
        return
    L = ids.shape[1] if ids is not None else math.inf  # without input_ids: `missing` is validate's to say
    if responses.dim() != 2 or not 0 < responses.shape[1] < L:
        raise InvalidArgument(f"tensor 'responses' must be (B, T) with 0 < T < {L}, got {list(responses.shape)}")


def routing_shape(config: dict) -> tuple[int, int, int] | None:
    """(MoE layers, experts per token, experts) of a model's config.json; None for a dense model."""
    moe = facts(config)
    if moe is None or not moe.layers:
        return None
    return len(moe.layers), moe.top_k, moe.num_experts


def check_routed(t: torch.Tensor, rows_by_columns: tuple[int, int], experts: tuple[int, int, int] | None) -> None:
    """ROUTED (routing replay): (rows, sequence, MoE layers, top-k) integers naming the model's experts."""
    if experts is None:
        raise InvalidArgument(f"tensor {ROUTED!r}: the model is not a mixture of experts (no router to replay)")
    layers, k, count = experts
    if tuple(t.shape) != (*rows_by_columns, layers, k) or t.is_floating_point() or t.dtype == torch.bool:
        want = [*rows_by_columns, layers, k]
        raise InvalidArgument(
            f"tensor {ROUTED!r} must be {want} integers (rows, sequence, layers, top-k), got {t.dtype} {list(t.shape)}"
        )
    if t.numel() and not (0 <= int(t.min()) and int(t.max()) < count):
        raise InvalidArgument(f"tensor {ROUTED!r} holds values outside 0..{count - 1} (the model's experts)")


def shard(data: DataProto, world_size: int, unit: int = 1) -> tuple[list[DataProto], int]:
    """One equal part per rank, after padding; returns (parts, number of padding rows)."""
    padded, pad = pad_to_divisor(data, world_size * unit)
    if pad and "response_mask" in padded.batch:
        mask = padded.batch["response_mask"].clone()
        mask[len(data) :] = 0
        padded.batch["response_mask"] = mask
    return padded.chunk(world_size), pad


def minibatches(data: DataProto, count: int, unit: int = 1) -> list[DataProto]:
    """`count` consecutive parts, sizes a multiple of `unit` (a DPO pair) and within one unit of each other."""
    units = len(data) // unit
    count = max(1, min(count, units))
    bounds = [round(i * units / count) * unit for i in range(count + 1)]
    return [data.slice(a, b) for a, b in zip(bounds, bounds[1:])]


def num_minibatches(rows: int, mini_batch_size: int) -> int:
    return 1 if mini_batch_size <= 0 else math.ceil(rows / mini_batch_size)


def micro_batches(data: DataProto, size: int, keys: tuple[str, ...]) -> list[dict[str, torch.Tensor]]:
    return [{k: part.batch[k] for k in keys} for part in data.split(size)]


def row_extents(data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt tokens, response tokens) of each row: verl's layout, prompts left- and responses right-padded."""
    mask = data.batch["attention_mask"]
    P = mask.shape[1] - data.batch["responses"].shape[1]
    return mask[:, :P].sum(1), mask[:, P:].sum(1)


def token_groups(
    data: DataProto, max_tokens: int, unit: int = 1, count: int = 0, shared: bool = False, packed: bool = False
) -> list[torch.Tensor]:
    """Row indices of each micro-batch: units of `unit` adjacent rows (DPO pairs) sorted longest first and
    filled while units x (longest prompt + longest response) <= max_tokens (a unit longer than that goes
    alone); with `count` larger than that, the groups of most rows are halved until there are `count`
    (FSDP ranks must run the same number of passes).

    shared (the passes run each distinct prompt once, model.forward_response): the rows of a prompt go
    together, and a micro-batch costs distinct prompts x longest prompt + rows x longest response.
    packed (padding-free passes): a micro-batch costs its real tokens, each distinct prompt's once where
    shared."""
    prompt, response = row_extents(data)
    units = len(data) // unit
    up = prompt.view(units, unit).amax(1).tolist()
    ur = response.view(units, unit).amax(1).clamp(min=1).tolist()
    width = data.batch["responses"].shape[1]
    rows = (prompt_index(data.batch, width) if shared else torch.arange(len(data))).view(units, unit).tolist()
    family = [r[0] for r in rows]  # a unit's place in the order: with its first row's prompt
    longest: dict[int, int] = {}
    first: dict[int, int] = {}
    for u in range(units):
        longest[family[u]] = max(longest.get(family[u], 0), up[u] + ur[u])
        first.setdefault(family[u], u)
    order = sorted(range(units), key=lambda u: (-longest[family[u]], first[family[u]], -(up[u] + ur[u]), u))
    groups: list[list[int]] = [[]]
    prompts: set[int] = set()
    P, T, real = 0, 0, 0  # the current group's longest prompt and response, its tokens; `prompts`: its prompts
    # a unit's real tokens: with shared prompts its responses', its prompt's counted once for the group below
    tokens = (response if shared else prompt + response).view(units, unit).sum(1).tolist()
    own = dict(zip(sum(rows, []), prompt.tolist()))  # a prompt's real length, by its index
    for u in order:
        grown = (max(P, up[u]), max(T, ur[u]), prompts | set(rows[u]), real + tokens[u])
        if packed:
            cost = grown[3] + (sum(own[p] for p in grown[2]) if shared else 0)
        else:
            cost = len(grown[2]) * grown[0] + (len(groups[-1]) + 1) * unit * grown[1]
        if groups[-1] and cost > max_tokens:
            groups.append([])
            grown = (up[u], ur[u], set(rows[u]), tokens[u])
        groups[-1].append(u)
        P, T, prompts, real = grown
    while len(groups) < count:
        i = max(range(len(groups)), key=lambda j: len(groups[j]))
        if len(groups[i]) < 2:
            raise ValueError(f"cannot make {count} micro-batches of {units} units")
        half = len(groups[i]) // 2
        groups[i : i + 1] = [groups[i][:half], groups[i][half:]]
    return [(torch.tensor(g)[:, None] * unit + torch.arange(unit)).flatten() for g in groups]


def trimmed(data: DataProto, rows: torch.Tensor, keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """These rows of `keys`, cut to their own longest prompt (left) and response (right)."""
    part = data.select_idxs(rows)
    prompt, response = row_extents(part)
    L, T = part.batch["input_ids"].shape[1], part.batch["responses"].shape[1]
    left, keep = L - T - int(prompt.max()), max(1, int(response.max()))
    return {
        k: part.batch[k][:, left : L - T + keep]
        if k in ALIGNED
        else part.batch[k][:, :keep]
        if part.batch[k].dim() > 1 and k not in ROW_TENSORS
        else part.batch[k]
        for k in keys
    }


def restore(outs: list[torch.Tensor], groups: list[torch.Tensor], width: int) -> torch.Tensor:
    """Per-micro-batch outputs (rows, width_i, ...) back in the batch's row order, zero-padded to width."""
    padded = [torch.nn.functional.pad(o, (0, 0) * (o.dim() - 2) + (0, width - o.shape[1])) for o in outs]
    out = torch.empty((sum(len(g) for g in groups), *padded[0].shape[1:]), dtype=padded[0].dtype)
    out[torch.cat(groups)] = torch.cat(padded)
    return out
