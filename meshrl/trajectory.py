"""One multi-turn trajectory as it is recorded: the prompt's token ids, then every token of the response
in order, the policy's own (with the log-probs they were sampled with) and the context between its
turns (tool results, a user's reply, the template's text), masked apart.

The orchestrator's multi-turn episodes (orchestrator/sampling/multi_turn.py) and the OpenAI-compatible
gateway's sessions (meshrl/gateway) record into it, and the run lays it out in verl's rows (verl_rows).
"""

import dataclasses
import json

import numpy as np

from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors


@dataclasses.dataclass
class Trajectory:
    prompt: list[int]
    task: dict = dataclasses.field(default_factory=dict)
    tools: list[dict] | None = None  # the tool schemas its prompt lists (rollout.tool_parser)
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)  # 1: the policy's token, 0: context
    logprobs: list[float] = dataclasses.field(default_factory=list)
    spans: list[list[int]] = dataclasses.field(default_factory=list)  # [start, end) of each policy turn
    versions: list[int] = dataclasses.field(default_factory=list)  # the weight version of each policy turn
    env_reward: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)  # the environment's (or agent's) last info
    done: bool = False
    finish: str = "length"  # "stop": the episode ended; "length": a turn or token limit ended it
    error: str = ""

    def add(self, tokens: list[int], logprobs: list[float] | None, policy: bool) -> None:
        if policy:
            self.spans.append([len(self.tokens), len(self.tokens) + len(tokens)])
        self.tokens += tokens
        self.mask += [int(policy)] * len(tokens)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)

    def cut(self, length: int) -> "Trajectory":
        """A copy holding the response's first `length` tokens (a branch from that point)."""
        return dataclasses.replace(
            self,
            tokens=self.tokens[:length],
            mask=self.mask[:length],
            logprobs=self.logprobs[:length],
            spans=[s for s in self.spans if s[1] <= length],
            versions=self.versions[: sum(s[1] <= length for s in self.spans)],
            info={},
        )


def verl_rows(rows: DataProto, trajectories: list[Trajectory], tokenizer) -> DataProto:
    """The trajectories in verl's layout, one row each, after `rows` (their prompts' rows, whose columns they
    keep): `responses` holds every turn and observation, `response_mask` is 1 on the policy's tokens and 0
    on observations, `rollout_logprobs` is 0 on observations; columns `turns`, `turn_spans` ([start, end)
    of each policy turn in the response), `env_reward`, `env_error` and `tool_calls`. The batch's weight
    version is the oldest any turn used."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tensors = rollout_tensors(
        [t.prompt for t in trajectories],
        [t.tokens for t in trajectories],
        pad,
        [t.mask for t in trajectories],
        [t.logprobs for t in trajectories],
    )
    columns: dict[str, np.ndarray | list] = dict(rows.non_tensor_batch)
    columns.update(
        {
            "response_text": [tokenizer.decode(t.tokens, skip_special_tokens=True) for t in trajectories],
            "finish_reason": [t.finish for t in trajectories],
            "turns": [len(t.spans) for t in trajectories],
            "turn_spans": [json.dumps(t.spans) for t in trajectories],
            "env_reward": [t.env_reward for t in trajectories],
            "env_error": [t.error for t in trajectories],
            "tool_calls": [int(t.info.get("tool_calls", 0)) for t in trajectories],
        }
    )
    versions = [v for t in trajectories for v in t.versions]
    return DataProto(
        tensors,
        {k: np.array(v, dtype=object) for k, v in columns.items()},
        {"weight_version": min(versions) if versions else 0, "pad_token_id": pad},
    )
