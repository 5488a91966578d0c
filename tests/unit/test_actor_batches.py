"""Micro-batches by token budget (services/actor/batches.py): groups within the budget, columns cut only
where every row of a micro-batch is padding, and outputs put back in the batch's row order; and the checks
an incoming batch passes first."""

import pytest
import torch

from meshrl.dataproto import DataProto
from meshrl.errors import InvalidArgument
from services.actor.batches import BASE, restore, row_extents, token_groups, trimmed, validate

P, T = 6, 5
PROMPTS = [6, 2, 3, 6, 1, 4, 5, 2]
RESPONSES = [5, 1, 3, 2, 5, 0, 1, 4]


def ragged() -> DataProto:
    """verl's layout: prompts left-padded to P, responses right-padded to T (padding ids are 0)."""
    n = len(PROMPTS)
    mask = torch.zeros(n, P + T, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        mask[i, P - p : P + r] = 1
    ids = torch.randint(4, 100, (n, P + T), generator=torch.Generator().manual_seed(0)) * mask
    return DataProto(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, P:],
            "response_mask": mask[:, P:].float(),
            "advantages": torch.arange(n, dtype=torch.float32)[:, None].expand(n, T).contiguous(),
        }
    )


def test_extents_are_the_rows_own_lengths():
    prompt, response = row_extents(ragged())
    assert prompt.tolist() == PROMPTS and response.tolist() == RESPONSES


@pytest.mark.parametrize("budget", [1, 12, 20, 40, 1000])
def test_groups_cover_every_row_once_within_the_budget(budget):
    data = ragged()
    groups = token_groups(data, budget)
    assert sorted(torch.cat(groups).tolist()) == list(range(len(data)))
    for g in groups:
        width = max(PROMPTS[i] for i in g) + max(1, max(RESPONSES[i] for i in g))
        assert len(g) == 1 or len(g) * width <= budget  # a row longer than the budget goes alone
    if budget >= len(data) * (P + T):
        assert len(groups) == 1


def test_a_larger_count_splits_groups_and_pairs_stay_together():
    data = ragged()
    assert len(token_groups(data, 1000)) == 1
    assert sorted(len(g) for g in token_groups(data, 1000, count=3)) == [2, 2, 4]
    pairs = token_groups(data, 30, unit=2)
    for g in pairs:
        assert len(g) % 2 == 0 and all(g[i] % 2 == 0 and g[i + 1] == g[i] + 1 for i in range(0, len(g), 2))
    with pytest.raises(ValueError, match="cannot make 9 micro-batches of 8 units"):
        token_groups(data, 1000, count=9)


def test_trimming_cuts_only_padding_and_restore_undoes_it():
    data = ragged()
    keys = (*BASE, "response_mask", "advantages")
    groups = token_groups(data, 20)
    micros = [trimmed(data, g, keys) for g in groups]
    kept = 0
    for g, mb in zip(groups, micros):
        width = max(PROMPTS[i] for i in g) + max(1, max(RESPONSES[i] for i in g))
        assert mb["input_ids"].shape == (len(g), width) and mb["responses"].shape[1] == width - max(
            PROMPTS[i] for i in g
        )
        kept += int(mb["attention_mask"].sum())
        # the cut keeps each row's response at the end of its prompt: the positions a forward predicts from
        assert torch.equal(mb["input_ids"][:, -mb["responses"].shape[1] :], mb["responses"])
    assert kept == int(data.batch["attention_mask"].sum())  # no valid token was cut
    back = restore([mb["advantages"] * mb["response_mask"] for mb in micros], groups, T)
    assert torch.equal(back, data.batch["advantages"] * data.batch["response_mask"])
    logits = restore([torch.ones(len(g), mb["responses"].shape[1], 3) for g, mb in zip(groups, micros)], groups, T)
    assert logits.shape == (len(data), T, 3)


def test_a_shared_budget_keeps_a_prompts_rows_together_and_counts_the_prompt_once():
    """shared=True (the actor runs each distinct prompt once): a micro-batch costs distinct prompts x
    longest prompt + rows x longest response, and a prompt's rows are not scattered over micro-batches."""
    from testkit.batches import grouped

    data = DataProto(grouped([6, 3, 4, 5], [[5, 1, 3, 2], [5, 5, 1, 4], [1, 2, 3, 4], [2, 2, 2, 2]]))
    prompt_of = [i // 4 for i in range(16)]
    prompt, response = row_extents(data)
    groups = token_groups(data, 40, shared=True)
    assert sorted(torch.cat(groups).tolist()) == list(range(16))
    for g in groups:
        rows = g.tolist()
        cost = len({prompt_of[i] for i in rows}) * int(prompt[g].max()) + len(rows) * max(1, int(response[g].max()))
        assert len(rows) == 1 or cost <= 40
    split = [p for p in range(4) if sum(any(prompt_of[i] == p for i in g.tolist()) for g in groups) > 1]
    assert len(split) <= len(groups) - 1  # only where one micro-batch ends and the next begins
    assert len(groups) < len(token_groups(data, 40))  # counting each prompt once fits more rows in a pass


@pytest.mark.parametrize("key", ["input_ids", "responses", "position_ids"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bool])
def test_token_ids_and_positions_must_be_integers(key, dtype):
    """A float `responses` passed every check and failed in a rank's gather(): INTERNAL, not the
    INVALID_ARGUMENT naming the tensor (InvalidArgument, meshrl/rpc/interceptors.py)."""
    data = ragged()
    validate(data, BASE, world_size=2, vocab_size=100, positions=64)
    data.batch[key] = data.batch[key].to(dtype)
    with pytest.raises(InvalidArgument, match=f"tensor '{key}' must .*integers"):
        validate(data, BASE, world_size=2, vocab_size=100, positions=64)
