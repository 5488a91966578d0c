"""Prompts in, verl's rollout layout out.

In: input_ids + attention_mask (left padded), or a `prompt` column of chat
messages (a plain string is one user message) rendered with the tokenizer's
chat template. Out, n rows per prompt (adjacent): prompts (left padded),
responses (right padded), input_ids, attention_mask, position_ids,
response_mask, rollout_logprobs; the input's columns repeated; response_text
and finish_reason columns.
"""

import numpy as np
import torch

from meshrl import modalities
from meshrl.algos.router_replay import ROUTED, dtype_for, filler
from meshrl.chat import as_messages, render
from meshrl.dataproto import DataProto, object_array
from meshrl.errors import InvalidArgument
from meshrl.layout import rollout_tensors
from services.rollout.sampling import Completion


def read_prompts(
    data: DataProto, tokenizer, max_model_len: int, max_new_tokens: int, vocab_size: int
) -> list[list[int]]:
    if "input_ids" in data.batch:
        ids = data.batch["input_ids"]
        mask = data.batch.get("attention_mask")
        if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise InvalidArgument(f"tensor 'input_ids' must be (B, L) integers, got {list(ids.shape)} {ids.dtype}")
        if mask is None or mask.shape != ids.shape:
            raise InvalidArgument("tensor 'attention_mask' must come with input_ids, of the same shape")
        outside = mask.bool() & ((ids < 0) | (ids >= vocab_size))  # one pass over the tensor, not per token
        if outside.any():
            row, col = (int(x) for x in outside.nonzero()[0])
            raise InvalidArgument(
                f"row {row}: token id {int(ids[row, col])} is outside the vocabulary (0..{vocab_size - 1})"
            )
        prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    elif "prompt" in data.non_tensor_batch:
        prompts = []
        for i, prompt in enumerate(data.non_tensor_batch["prompt"]):
            try:
                text = render(tokenizer, as_messages(prompt, f"row {i}"), f"row {i}")
            except ValueError as e:
                raise InvalidArgument(str(e)) from None
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    else:
        raise InvalidArgument("Generate needs input_ids + attention_mask tensors or a 'prompt' column of chat messages")
    if not prompts:
        raise InvalidArgument("the batch has no prompts")
    for i, p in enumerate(prompts):
        if not p:
            raise InvalidArgument(f"row {i}: empty prompt")
        if len(p) + max_new_tokens > max_model_len:
            raise InvalidArgument(
                f"row {i}: prompt of {len(p)} tokens + max_new_tokens {max_new_tokens} exceeds "
                f"the model's limit of {max_model_len}"
            )
    return prompts


def read_media(data: DataProto, backend) -> dict:
    """generate's media argument: each prompt's items (encoded bytes, meshrl/modalities) by column, for every
    modality the batch carries any of; refused on a backend that does not take that modality."""
    media = {}
    for m in modalities.MODALITIES:
        column = data.non_tensor_batch.get(m.column)
        if not modalities.carries(column):
            continue
        if m.name not in getattr(backend, "takes", ()):
            raise InvalidArgument(
                f"the batch has {m.column}, which the {backend.name} rollout backend does not take here "
                f"(rollout.backend=hf does; meshrl does not pass {m.name} to vLLM yet)"
            )
        for i, items in enumerate(column):
            if items is not None and not (
                isinstance(items, (list, tuple)) and all(isinstance(p, bytes) for p in items)
            ):
                raise InvalidArgument(f"row {i}: {m.column} must be a list of encoded {m.name} (bytes)")
        media[m.column] = [list(p or ()) for p in column]
    return {"media": media} if media else {}


def build(
    data: DataProto, prompts: list[list[int]], completions: list[list[Completion]], pad: int, with_logprobs: bool
) -> DataProto:
    n = len(completions[0])
    rows = [(p, c) for p, cs in zip(prompts, completions) for c in cs]
    tensors = rollout_tensors(
        [p for p, _ in rows],
        [c.token_ids for _, c in rows],
        pad,
        logprobs=[logprobs_of(c) for _, c in rows] if with_logprobs else None,
    )
    if rows and rows[0][1].routed_experts is not None:
        tensors[ROUTED] = routed_tensor([p for p, _ in rows], [c for _, c in rows], tensors["input_ids"].shape[1])
    columns = {k: [v for v in col for _ in range(n)] for k, col in data.non_tensor_batch.items()}
    columns["response_text"] = [c.text for _, c in rows]
    columns["finish_reason"] = [c.finish_reason for _, c in rows]
    return DataProto(tensors, {k: object_array(v) for k, v in columns.items()}, {**data.meta_info, "pad_token_id": pad})


def routed_tensor(prompts: list[list[int]], completions: list[Completion], width: int) -> torch.Tensor:
    """The completions' routed experts beside input_ids: (rows, width, layers, k), each row's from where its
    left-padded prompt starts; the rest (padding, each response's last token) router_replay.filler."""
    first = np.asarray(completions[0].routed_experts)
    layers, k = first.shape[1:]
    top = max(int(np.asarray(c.routed_experts).max(initial=0)) for c in completions)
    out = filler((len(prompts), width, layers), k, dtype_for(top + 1))
    P = max(map(len, prompts))  # the prompts' columns, as rollout_tensors lays them out
    for i, (p, c) in enumerate(zip(prompts, completions)):
        got = torch.from_numpy(np.asarray(c.routed_experts)).to(out.dtype)
        if len(got) != len(p) + len(c.token_ids) - 1:  # e.g. an engine that left out prefix-cached tokens
            raise RuntimeError(
                f"routed_experts: the engine returned {len(got)} tokens' experts for a prompt of {len(p)} and "
                f"{len(c.token_ids)} response tokens (want every token but the last); it cannot be lined up"
            )
        out[i, P - len(p) : P - len(p) + len(got)] = got
    return out


def token_versions(
    response_mask: torch.Tensor, completions: list[Completion], steps: list[int], updates: list[int]
) -> torch.Tensor:
    """(rows, T) int64: the weight version of each response token (on_update=keep), 0 past each response.
    Rows in lockstep (the HF backend) took token t from the call's engine step t, whose versions are
    `steps`. A completion with `switches` (vLLM, per sample) took effect of the i-th update loaded during the
    call at token count switches[i]; `updates` is the call's version at its start, then each such update's."""
    kept = [t for t in range(1, len(steps)) if steps[t] != steps[t - 1]]
    lockstep = (torch.tensor([steps[0], *(steps[t] for t in kept)]), torch.tensor(kept, dtype=torch.int64))
    tracked = torch.tensor(updates)
    T = response_mask.shape[1]
    out = torch.zeros(response_mask.shape, dtype=torch.int64)
    for row, c in enumerate(completions):
        versions, switches = lockstep if c.switches is None else (tracked, torch.tensor(c.switches, dtype=torch.int64))
        index = torch.bucketize(torch.arange(T), switches, right=True).clamp(max=len(versions) - 1)
        out[row] = versions[index]
    return out * (response_mask > 0)


def logprobs_of(c: Completion) -> list[float]:
    assert c.logprobs is not None, "the backend was asked for log-probs"
    return c.logprobs
