"""Batches in verl's layout for the tests of the actor's passes: prompts that several rows share, with
responses of given lengths (grouped)."""

import torch


def grouped(prompts: list[int], responses: list[list[int]], width=(6, 5), seed=0) -> dict:
    """Prompt i (of prompts[i] tokens) sampled len(responses[i]) times, with those response lengths, in
    verl's layout (prompts left-, responses right-padded); rows of a prompt adjacent, as a rollout returns them."""
    P, T = width
    g = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(4, 60, (P,), generator=g) for _ in prompts]
    rows = [(p, r, t) for p, rs, t in zip(prompts, responses, tokens) for r in rs]
    mask = torch.zeros(len(rows), P + T, dtype=torch.long)
    ids = torch.randint(4, 60, (len(rows), P + T), generator=g)
    for i, (p, r, prompt) in enumerate(rows):
        mask[i, P - p : P + r] = 1
        ids[i, :P] = prompt
    ids = ids * mask
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": ids[:, P:],
        "response_mask": mask[:, P:].float(),
    }
