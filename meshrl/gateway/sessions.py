"""A gateway session's recording: every sample the model produced for one key, token for token.

A sample is a Trajectory (meshrl/trajectory.py) and the history it renders: for a chat call the
messages as the agent sent them plus the model's reply, for a completion the prompt text (or token ids)
plus what the model wrote. Marks record where each model turn ended (history length, token count).

When a call comes, its history is matched against the recorded samples at their marks, newest first:

- it continues a sample from one of its marks: the tokens up to that mark are kept exactly as they were
  (text the model wrote is never tokenized again), what the agent added since (tool results, a user's
  reply) is rendered as the multi-turn path renders it (meshrl.chat.after_turn) and appended as
  context, masked out of training;
- from the sample's last mark the call extends that sample; from an earlier mark (a retry, an agent
  that went back) it branches: a new sample with the tokens up to that mark;
- where the agent edited a reply, the match stops before it: the sample branches at the last turn
  that still matches, and the edited reply joins what the agent added, as context (the model's own
  earlier turns stay trained, the edited one is not);
- nothing matches (its first call, or the first reply edited): a new sample, its prompt the whole
  history rendered by the chat template, nothing before the new turn trained.

Only tokens the model produced are ever trained; each keeps the weight version that produced it.
"""

import dataclasses
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from meshrl.chat import after_turn, render
from meshrl.gateway.protocol import Request, RequestError
from meshrl.trajectory import Trajectory


@dataclasses.dataclass
class Sample:
    traj: Trajectory
    history: Any  # list of normal messages (chat), prompt text (str) or token ids (list[int])
    marks: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (history len, tokens) per turn


@dataclasses.dataclass
class Plan:
    """What a call generates after: the sample it starts from (tokens up to its mark plus the new
    context) and which recorded sample it extends in place (None: its choices are new samples)."""

    base: Trajectory
    history: Any
    extends: Sample | None
    marks: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # the base's own, kept


BINDING = -1  # Session.owner of a key whose process is starting


class Session:
    """One key's samples. `budget`: response tokens a sample may hold (None: no limit); `max_calls`: calls
    the key may make (None: no limit; past it, as past the budget, a call gets an empty turn that ends for
    "length", so an agent's loop ends as it would at a model's limit); `keep`: samples kept (a long-lived
    key forgets its oldest)."""

    def __init__(
        self,
        key: str | None = None,
        budget: int | None = None,
        max_calls: int | None = None,
        keep: int | None = None,
    ):
        self.key = key or f"sk-meshrl-{secrets.token_urlsafe(24)}"
        self.budget, self.max_calls, self.keep = budget, max_calls, keep
        self.samples: list[Sample] = []
        self.calls = 0
        self.last: Sample | None = None  # the sample the latest call wrote (its first choice's)
        self.closed = False
        self.replica: str | None = None  # where the engine serves it (its prefix is there)
        self.lock = threading.Lock()
        # the process the key is bound to (it and those below it may use it: gateway/callers.py); 0: any
        # caller; BINDING: bound, the process not started yet
        self.owner = 0

    def plan(self, request: Request, tokenizer, ends: frozenset[int]) -> Plan:
        """Where `request` continues the recording (see the module's docstring). RequestError if the
        template cannot render the history, or the key is spent."""
        with self.lock:
            if self.closed:
                raise RequestError("this key's episode has ended", status=401, code="invalid_api_key")
            self.calls += 1
            history = request.messages if request.chat else request.prompt
            for s in reversed(self.samples):
                if request.chat and s.traj.tools != request.tools:
                    continue
                for h, t in reversed(s.marks):
                    if len(history) >= h and _same(history[:h], s.history[:h]):
                        base = s.traj.cut(t)
                        extends = s if t == len(s.traj.tokens) else None
                        break
                else:
                    continue
                context = self._context(request, history[h:], base, tokenizer, ends)
                base.add(context, None, policy=False)
                return Plan(base, history, extends, [m for m in s.marks if m[1] <= t])
        return Plan(self._fresh(request, tokenizer), history, None)

    @staticmethod
    def _fresh(request: Request, tokenizer) -> Trajectory:
        if not request.chat:
            prompt = request.prompt
            ids = prompt if isinstance(prompt, list) else tokenizer(prompt, add_special_tokens=False)["input_ids"]
            return Trajectory(list(ids))
        try:
            text = render(tokenizer, request.messages, "messages", request.tools)
        except ValueError as e:
            raise RequestError(str(e), "messages") from None
        return Trajectory(tokenizer(text, add_special_tokens=False)["input_ids"], tools=request.tools)

    @staticmethod
    def _context(request: Request, added: Sequence, base: Trajectory, tokenizer, ends: frozenset[int]) -> list[int]:
        """The tokens of what the agent added after a model turn: token ids as given, text tokenized, chat
        messages as the template renders them after a closed turn (a turn cut short is closed first)."""
        if not request.chat:
            return list(added) if isinstance(added, list) else tokenizer(added, add_special_tokens=False)["input_ids"]
        closed = "" if base.tokens and base.tokens[-1] in ends else tokenizer.eos_token or ""
        try:
            text = closed + after_turn(tokenizer, list(added), request.tools)
        except Exception as e:  # noqa: BLE001 - the template is the model's, the messages the agent's
            raise RequestError(f"the chat template cannot render these messages: {e}", "messages") from None
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def record(self, plan: Plan, turns: list[tuple[list[int], list[float], int, Any]]) -> None:
        """The call's choices, each (tokens, log-probs, weight version, what the agent gets back: the
        reply message (chat) or its text) as samples, each after the same context: the first in place of
        the sample it extends (if no other call replaced it meanwhile), and the episode's sample from now
        on, as an agent goes on with the first choice."""
        start = len(plan.base.tokens)
        with self.lock:
            for k, (tokens, logprobs, version, said) in enumerate(turns):
                traj = plan.base.cut(start) if k else plan.base
                traj.add(tokens, logprobs, policy=True)
                traj.versions.append(version)
                history = [*plan.history, said] if isinstance(said, dict) else plan.history + said
                sample = Sample(traj, history, [*plan.marks, (len(history), len(traj.tokens))])
                place = next((i for i, s in enumerate(self.samples) if s is plan.extends), None) if k == 0 else None
                if place is not None:
                    self.samples[place] = sample
                else:
                    self.samples.append(sample)
                if k == 0:
                    self.last = sample
            if self.keep is not None and len(self.samples) > self.keep:
                del self.samples[: len(self.samples) - self.keep]

    def room(self, plan: Plan) -> int | None:
        """Response tokens the sample may still take (None: no budget); 0 once the key has made its calls."""
        if self.max_calls is not None and self.calls > self.max_calls:
            return 0
        return None if self.budget is None else self.budget - len(plan.base.tokens)

    def final(self) -> Trajectory | None:
        """The sample the episode ended in: the one its last call wrote."""
        with self.lock:
            return None if self.last is None else self.last.traj


def _same(a: Sequence, b: Sequence) -> bool:
    return list(a) == list(b)
