"""The HuggingFace backend: transformers' generate, for small models and debugging.

Log-probs come from one forward pass over prompt + response after sampling, the
same computation the actor does. Stop strings cut the response after the token
that completes them.
"""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from meshrl import cuda_ipc
from meshrl.shm import attach
from services.rollout.config import RolloutConfig
from services.rollout.sampling import Completion, Sampling


class HFBackend:
    name = "hf"

    def __init__(self, cfg: RolloutConfig):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype)).to(self.device)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], s: Sampling) -> list[list[Completion]]:
        rows = [p for p in prompts for _ in range(s.n)]
        width = max(map(len, rows))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=self.device)
        if s.seed is not None:
            torch.manual_seed(s.seed)
        eos = [self.tokenizer.eos_token_id, *s.stop_token_ids]
        sampling = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p,
                    "top_k": s.top_k if s.top_k > 0 else 0} if s.temperature > 0 else {"do_sample": False}
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=s.max_new_tokens,
                                  eos_token_id=eos, pad_token_id=self.pad, **sampling)
        completions = [self._completion(out[i, width:].tolist(), eos, s) for i in range(len(rows))]
        if s.logprobs:
            self._add_logprobs(ids, mask, completions, s.temperature if s.temperature > 0 else 1.0)
        return [completions[i * s.n:(i + 1) * s.n] for i in range(len(prompts))]

    def _completion(self, tokens: list[int], eos: list[int], s: Sampling) -> Completion:
        finish = "length"
        for i, t in enumerate(tokens):
            if t in eos:
                tokens, finish = tokens[:i + 1], "stop"
                break
        for i in range(1, len(tokens) + 1) if s.stop else ():
            text = self.tokenizer.decode(tokens[:i], skip_special_tokens=True)
            if any(stop in text for stop in s.stop):
                tokens, finish = tokens[:i], "stop"
                break
        return Completion(tokens, None, self.tokenizer.decode(tokens, skip_special_tokens=True), finish)

    def _add_logprobs(self, ids, mask, completions, temperature: float) -> None:
        T = max(len(c.token_ids) for c in completions)
        if T == 0:
            return
        resp = torch.tensor([c.token_ids + [self.pad] * (T - len(c.token_ids)) for c in completions], device=self.device)
        rmask = torch.tensor([[1] * len(c.token_ids) + [0] * (T - len(c.token_ids)) for c in completions],
                             device=self.device)
        full, full_mask = torch.cat([ids, resp], 1), torch.cat([mask, rmask], 1)
        logits = self.model(input_ids=full, attention_mask=full_mask,
                            position_ids=(full_mask.cumsum(1) - 1).clamp(min=0)).logits[:, -T - 1:-1]
        lp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        for c, row in zip(completions, lp.cpu()):
            c.logprobs = row[:len(c.token_ids)].tolist()

    def load_weights(self, segment: str, refs: list[list]) -> None:
        seg = attach(segment)
        self._copy_in((name, seg.tensor(getattr(torch, dtype), shape, offset)) for name, dtype, shape, offset in refs)

    def load_weights_cuda_ipc(self, handle: list, refs: list[list]) -> None:
        self._copy_in(cuda_ipc.views(cuda_ipc.open_handle(handle), refs))

    @torch.no_grad()
    def _copy_in(self, named) -> None:
        params = dict(self.model.named_parameters())
        for name, t in named:
            params[name].copy_(t)

    def sleep(self, level: int) -> None:
        self.model.to("cpu")

    def wake_up(self) -> None:
        self.model.to(self.device)
