"""The HuggingFace backend: transformers' generate, for small models and debugging.

A prompt sampled n times is run once: its keys and values (all but its last
token) are computed for the distinct prompts and repeated n times into the
cache generate starts from, as vLLM shares a prompt's blocks among its n
samples (not for families whose cache or positions cannot be continued from
such a prefill, meshrl/families.shares_prefill: each sample runs the whole
prompt there). Log-probs are those of generate's own logits (raw, over the
temperature), the same quantity the actor computes. Stop strings cut the
response after the token that completes them.

Each sample draws from a random stream of its own (row_sampler: prompt i of a
call with the call's seed + i, as vLLM seeds its requests), not from one torch
generator for the batch, so what a prompt samples does not depend on the other
prompts of its call or on how a rollout fleet cut the call.

A LoRA adapter is put into the model by peft (its layers wrap the model's own,
in place), so generate runs the base weights plus the adapter; new full weights
take the model's own layers back first (PeftModel.unload: dropped, not merged).
"""

import contextlib
from typing import TYPE_CHECKING

import torch
from transformers import (
    AutoConfig,
    AutoTokenizer,
    DynamicCache,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from meshrl import cuda_ipc, file_layout, modalities
from meshrl.algos.moe import routers
from meshrl.algos.router_replay import GenerationRecord
from meshrl.config.rollout import RolloutConfig
from meshrl.errors import Aborted, InvalidArgument
from meshrl.families import shares_prefill
from meshrl.models import causal_class, end_ids, weight_tensors
from meshrl.shm import attach
from services.rollout.row_sampler import RowSampler, row_seeds
from services.rollout.sampling import Completion, Sampling
from services.rollout.weights import Adapter

if TYPE_CHECKING:
    from peft import PeftModel


class WhileAlive(StoppingCriteria):
    """Stops every sequence once the caller is gone: a cancelled request frees the engine within a token.
    `after(input_ids)`, if given, runs once alive() said go on (with on_update=recompute: the cache made
    again when weights loaded while it waited)."""

    def __init__(self, alive, after=None):
        self.alive, self.after = alive, after

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        go_on = self.alive()
        if go_on and self.after is not None:
            self.after(input_ids)
        return torch.full((input_ids.shape[0],), not go_on, dtype=torch.bool, device=input_ids.device)


def routed(completions: list[Completion], calls: list[torch.Tensor], prompts: list[list[int]], n: int) -> None:
    """Each completion's routed_experts from a generate's forwards (rows, columns, layers, k) in order: the
    distinct prompts' prefill (repeated for their n samples), then one column per generated token. A row's
    prompt is left-padded to the widest; its last token was never run."""
    rows = len(prompts) * n
    full = torch.cat([c if len(c) == rows else c.repeat_interleave(n, 0) for c in calls], 1)
    width = max(map(len, prompts))
    for i, c in enumerate(completions):
        start = width - len(prompts[i // n])
        c.routed_experts = full[i, start : width + len(c.token_ids) - 1].numpy()


class HFBackend:
    name = "hf"
    concurrent = False  # generate runs one call at a time: the rollout service queues the others
    takes = ("pictures",)  # the modalities it passes to generate (meshrl/modalities), for a model reading them

    def __init__(self, cfg: RolloutConfig):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        config = AutoConfig.from_pretrained(cfg.model)
        model = causal_class(config).from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype))
        self.media = modalities.Readers(cfg.model, config.to_dict(), eager=True)  # a vision-language model's
        self.share_prefill = shares_prefill(config.to_dict())  # n samples from one prefill (meshrl/families.py)
        self.offsets = [m for m in model.modules() if hasattr(m, "rope_deltas")]  # its modules keeping them
        self.model = model.to(self.device)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        self.ends = end_ids(self.tokenizer, self.model.generation_config)  # every end token, as vLLM stops
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.peft: PeftModel | None = None  # the PeftModel around self.model while an adapter is in use
        self.lora_params: dict[str, torch.Tensor] = {}  # its adapter's parameters by peft's saved names
        self.lora_shape: tuple = ()  # its (rank, alpha, target modules): another shape needs a new wrapping
        self.recompute = cfg.on_update == "recompute"  # an update between steps makes the calls' caches again
        self.loads = 0  # weight updates finished (weights_loaded): a call's cache is of the count it saw

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], s: Sampling, alive=None, media: dict | None = None
    ) -> list[list[Completion]]:
        """Samples of each prompt; `alive()` turning false (the caller cancelled or its deadline passed)
        stops generation after the current token and raises Aborted. media: each prompt's items by column
        (encoded pictures under `images`: meshrl/modalities), for a model that reads them."""
        if s.routed_experts and not routers(self.model):
            raise InvalidArgument("sampling.routed_experts: the model is not a mixture of experts (no router)")
        if self.recompute and any(map(modalities.carries, (media or {}).values())):
            raise InvalidArgument(f"rollout.on_update=recompute does not take prompts with {', '.join(media or {})}")
        try:
            inputs, readers = self.media.generate_inputs(prompts, media or {}, s.n)
        except modalities.MediaError as e:
            raise InvalidArgument(str(e)) from None
        dtype = self.model.dtype
        seen = {k: v.to(self.device, dtype if v.is_floating_point() else None) for k, v in inputs.items()}
        for module in self.offsets:  # Qwen2-VL keeps the last call's position offsets: not this call's
            module.rope_deltas = None
        record = GenerationRecord(self.model) if s.routed_experts else None
        with record if record is not None else contextlib.nullcontext():
            completions = self._generate(prompts, s, alive, record, (seen, readers) if readers else None)
        if record is not None:
            routed(completions, record.calls(), prompts, s.n)
        return [completions[i * s.n : (i + 1) * s.n] for i in range(len(prompts))]

    def _generate(self, prompts: list[list[int]], s: Sampling, alive, record=None, media=None) -> list[Completion]:
        """media: (generate's inputs for the prompts' items, the readers that made them), None without any."""
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        # a prompt with pictures runs whole in generate (its positions are Qwen2-VL's three-axis ones)
        shared = s.n > 1 and width > 1 and media is None and self.share_prefill
        cache = self._prefill(ids, mask, s.n) if shared else None
        ids, mask = ids.repeat_interleave(s.n, 0), mask.repeat_interleave(s.n, 0)
        seen: dict = {}
        if media is not None:  # the items' inputs, and what their readers read off the ids
            seen = {**media[0], **{k: v for r in media[1] for k, v in r.along(ids).items()}}
        after = None
        if self.recompute and alive is not None:
            cache = cache if cache is not None else DynamicCache(config=self.model.config)
            after = self._recomputing(cache, mask, self.loads, s.max_new_tokens, record)
        eos = [*self.ends, *s.stop_token_ids]
        # generate picks the argmax of what RowSampler leaves: each sample's own stream, not one for the batch
        sampler = (
            [RowSampler(row_seeds(s.seed, len(prompts)), s.n, s.temperature, s.top_k, s.top_p)]
            if s.temperature > 0
            else []
        )
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            **({"past_key_values": cache} if cache is not None else {}),  # GPT-1's generate takes none
            max_new_tokens=s.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=self.pad,
            return_dict_in_generate=True,
            output_logits=s.logprobs,
            stopping_criteria=StoppingCriteriaList([WhileAlive(alive, after)]) if alive else None,
            # a row that completes a stop string is done (the batch ends sooner);
            # _completion still cuts it there
            **({"stop_strings": s.stop, "tokenizer": self.tokenizer} if s.stop else {}),
            do_sample=False,
            logits_processor=LogitsProcessorList(sampler),
            **seen,
        )
        if alive is not None and not alive():
            raise Aborted("generation stopped: the caller cancelled or its deadline passed")
        new = out.sequences[:, width:]
        if s.logprobs:  # of the tokens sampled, under softmax(logits / temperature), as the actor computes them
            logits = torch.stack(out.logits, 1).float() / (s.temperature if s.temperature > 0 else 1.0)
            lp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1).cpu()
        return [
            self._completion(new[i].tolist(), lp[i].tolist() if s.logprobs else None, eos, s) for i in range(len(ids))
        ]

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, n: int) -> DynamicCache:
        """The cache of each prompt but its last token, repeated for its n samples (generate runs the rest)."""
        cache = DynamicCache(config=self.model.config)
        self.model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=(mask[:, :-1].cumsum(1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_repeat_interleave(n)
        return cache

    def _recomputing(self, cache: DynamicCache, mask: torch.Tensor, seen: int, most: int, record):
        """on_update=recompute: after a step that waited out a weight update (or an adapter), the keys and
        values of every token so far but the last (which generate runs next) are computed again with the
        new weights, as vLLM's preempted requests prefill again, and put in place of the cache's (generate
        holds it). Not after the last step (`most` tokens: nothing runs next); a routing record keeps the
        generation's own forwards only."""

        def after(input_ids: torch.Tensor) -> None:
            nonlocal seen
            if self.loads == seen:
                return
            seen = self.loads
            grown = input_ids.shape[1] - mask.shape[1]  # generated tokens: generate's mask is 1 on each
            if grown >= most:
                return
            full = torch.cat([mask, mask.new_ones(len(mask), grown)], 1)[:, :-1]
            again = DynamicCache(config=self.model.config)
            with record.aside() if record is not None else contextlib.nullcontext():
                self.model(
                    input_ids=input_ids[:, :-1],
                    attention_mask=full,
                    position_ids=(full.cumsum(1) - 1).clamp(min=0),
                    past_key_values=again,
                    use_cache=True,
                    logits_to_keep=1,
                )
            for layer, fresh in zip(cache.layers, again.layers, strict=True):
                vars(layer).update(vars(fresh))  # whatever a layer keeps (keys and values, or a linear state)

        return after

    def _completion(self, tokens: list[int], logprobs: list[float] | None, eos: list[int], s: Sampling) -> Completion:
        finish = "length"
        for i, t in enumerate(tokens):
            if t in eos:
                tokens, finish = tokens[: i + 1], "stop"
                break
        for i in range(1, len(tokens) + 1) if s.stop else ():
            text = self.tokenizer.decode(tokens[:i], skip_special_tokens=True)
            if any(stop in text for stop in s.stop):
                tokens, finish = tokens[:i], "stop"
                break
        return Completion(
            tokens,
            None if logprobs is None else logprobs[: len(tokens)],
            self.tokenizer.decode(tokens, skip_special_tokens=True),  # type: ignore[arg-type]  # one sequence: a str
            finish,
        )

    def load_lora(self, adapter: Adapter) -> None:
        """Generate with this adapter from now on. An adapter of the shape in use is copied into its layers;
        another shape is wrapped anew."""
        from peft import LoraConfig, get_peft_model

        shape = (adapter.rank, adapter.alpha, sorted(adapter.target_modules))
        if self.peft is None or shape != self.lora_shape:
            self.drop_lora()
            config = LoraConfig(
                r=adapter.rank,
                lora_alpha=adapter.alpha,  # type: ignore[arg-type]  # annotated int; a float scales as well
                target_modules=shape[2],
                lora_dropout=0.0,
            )
            self.peft, self.lora_shape = get_peft_model(self.model, config), shape
            # saved name (lora_A.weight) -> the layer's parameter (lora_A.default.weight): a copy per tensor,
            # where peft's set_peft_model_state_dict walks every module of the model on each load (~30 ms
            # of a 104M model's 32 ms adapter push)
            self.lora_params = {
                n.replace(f".{self.peft.active_adapter}.", "."): p
                for n, p in self.peft.named_parameters()
                if ".lora_A." in n or ".lora_B." in n
            }
        with torch.no_grad():
            for name, tensor in adapter.tensors.items():  # the receiver checked every name and shape
                self.lora_params[name].copy_(tensor)
        self.loads += 1  # the policy changed: with recompute, the calls in flight make their caches again

    def drop_lora(self) -> None:
        if self.peft is not None:
            self.model = self.peft.unload()  # the same model, its own layers back in place
            self.peft, self.lora_shape, self.lora_params = None, (), {}

    def load_weights(self, segment: str, refs: list[list], reused: bool = False) -> None:
        seg = attach(segment)
        self._copy_in((name, seg.tensor(getattr(torch, dtype), shape, offset)) for name, dtype, shape, offset in refs)

    def load_weights_cuda_ipc(self, copies: list, refs: list[list], reused: bool = False) -> None:
        self._copy_in(cuda_ipc.views(cuda_ipc.open_copy(copies), refs))
        torch.cuda.synchronize()  # done with the sender's bucket on return: it refills it with the next

    def restart_update(self) -> None:
        """Nothing to end: each bucket is copied into the model as it comes (no update phases)."""

    def weights_loaded(self) -> None:
        self.loads += 1

    @torch.no_grad()
    def _copy_in(self, named) -> None:
        self.drop_lora()  # full weights: the policy whole (and the model's parameter names again)
        params = weight_tensors(self.model)
        tensors = dict(named)
        if any(name not in params for name in tensors):  # the files' names: a mixture of experts' per expert
            tensors = file_layout.to_memory(self.model, tensors)
        for name, t in tensors.items():
            param = params.get(name)
            if param is None or param.shape != t.shape:
                have = "no such parameter or buffer" if param is None else f"the parameter is {list(param.shape)}"
                raise ValueError(f"weights: {name} {list(t.shape)} does not fit the model ({have})")
            param.copy_(t)

    def close(self) -> None:
        pass

    def sleep(self, level: int) -> None:
        self.model.to("cpu")

    def wake_up(self, tags: list[str]) -> None:
        if not tags or "weights" in tags:  # generate allocates its cache per call: nothing else to wake
            self.model.to(self.device)
