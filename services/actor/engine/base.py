"""The training engine: owns the model, its optimizer and LR schedule on this rank.

An engine knows forward, forward-backward with a loss it is given, optimizer
step, state dicts, checkpoints and offload; it knows nothing of PPO or DPO (the
roles bring the losses). Subclasses only decide how the model is wrapped
(sharded or not) and the few operations that depend on it.
"""

import contextlib
import json
import math
import pathlib
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from meshrl import file_layout
from meshrl.config.actor import EngineConfig, OptimConfig
from meshrl.models import (
    causal_class,
    empty_model,
    load_model,
    lora_target_modules,
    lora_target_parameters,
    vision_tower,
)
from meshrl.v1 import rollout_pb2
from services.actor import lora, packing, sequence
from services.actor.comm import Cancelled, stop_requested

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # an exported folder takes them along


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextlib.contextmanager
def _dcp_errors(doing: str, path: pathlib.Path):
    """DCP's CheckpointException is a BaseException: it passed the ranks' `except Exception`, so a rank died of
    a malformed checkpoint and rank 0's call was never answered (its caller waited out its deadline). Every
    rank gets the same exception (DCP gathers them), so every rank raises this one and stays in the group."""
    try:
        yield
    except CheckpointException as e:
        first = next(iter(e.failures.values()), None)
        cause = first[0] if isinstance(first, tuple) else first
        raise RuntimeError(
            f"DCP could not {doing} the checkpoint at {path}: {type(cause).__name__}: {str(cause)[:500]}"
        ) from None


def lr_lambda(cfg: OptimConfig) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class Engine:
    name = "base"
    rank0_loads = False  # several ranks: only rank 0 loads the model, wrap_from_rank0 shares it out

    def __init__(self, cfg: EngineConfig, model_path: str, kind: str = "causal", optim: OptimConfig | None = None):
        if not dist.is_initialized():
            raise RuntimeError("an engine needs torch.distributed initialized (world size 1 is fine)")
        self.cfg, self.optim_cfg, self.model_path, self.kind = cfg, optim, model_path, kind
        # a trained role with lora_rank > 0 trains an adapter; the ref is the base model, adapter or not
        self.lora = cfg.lora_rank > 0 and optim is not None
        self.lora_targets: list[str] = []
        self.expert_adapters: dict[str, tuple[str, str, str]] = {}  # lora_experts: lora.expert_adapters
        self._files: Any = None  # a meta-device copy of the model: its file layout's conversions (to_files)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = default_device()
        torch.manual_seed(cfg.seed)  # a value head starts from the same weights on every rank
        if self.world_size > 1 and self.rank0_loads:  # one copy of the weights in host memory, not one per rank
            model = self.prepare(empty_model(model_path, kind, cfg.dropout), optim)
            full = self.prepare(load_model(model_path, kind, cfg.dropout), optim) if self.rank == 0 else None
            self.config = model.config
            self.module = self.wrap_from_rank0(model, full)
            del full
        else:
            model = self.prepare(load_model(model_path, kind, cfg.dropout), optim)
            self.config = model.config
            self.module = self.wrap(model.to(self.device))
        self.shards = None  # sequence parallelism: this rank's group (services/actor/sequence.py)
        if cfg.sequence_parallel > 1:
            sequence.check_heads(self.config, cfg.sequence_parallel)
            self.shards = sequence.groups(cfg.sequence_parallel)
            sequence.attach(self.module, self.shards)
            if self.device.type == "cpu":  # the exchanges' buffers are host memory only there
                sequence.return_large_buffers()
        self.optimizer = self.scheduler = None
        if optim is not None:
            trained = [p for p in self.module.parameters() if p.requires_grad]  # with LoRA: the adapter alone
            # on CPU one tensor at a time: the multi-tensor (foreach) step makes temporaries of every weight at
            # once, and host memory is what a CPU run runs out of (at Qwen2.5-0.5B's shape the actor's peak
            # fell from 9.48 to 9.18 GiB, its updates no slower: bench/RESULTS.md); the same arithmetic, the
            # same weights bit for bit
            self.optimizer = torch.optim.AdamW(
                trained,
                lr=optim.lr,
                betas=optim.betas,
                weight_decay=optim.weight_decay,
                foreach=self.device.type != "cpu",
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(optim))
        self.on_device = True

    def prepare(self, model: "PreTrainedModel", optim: OptimConfig | None) -> torch.nn.Module:
        if self.cfg.padding_free:
            packing.enable(model)
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()  # before peft, which then lets the embeddings' output need grad
        if self.lora:  # before sharding: FSDP then shards the adapter with the layer it adapts
            self.lora_targets = lora_target_modules(model, self.cfg)
            peft = lora.add_adapter(
                model, self.cfg, self.kind, self.lora_targets, lora_target_parameters(model, self.cfg)
            )
            self.expert_adapters = lora.expert_adapters(peft)
            return peft
        if optim is None:  # a frozen model (the reference policy)
            model.requires_grad_(False)
        tower = vision_tower(model)
        if tower is not None and self.cfg.freeze_vision:  # a vision-language model's encoder stays as loaded
            model.get_submodule(tower).requires_grad_(False)
        return model

    # ---- what subclasses decide --------------------------------------------------------

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def wrap_from_rank0(self, model: torch.nn.Module, full: torch.nn.Module | None) -> torch.nn.Module:
        """Several ranks: `model` is on the meta device everywhere, `full` the loaded model on rank 0
        (None elsewhere). The wrapped model with every rank's part of rank 0's weights. Collective."""
        raise NotImplementedError

    def autocast(self):
        """Context for forward passes (the plain engine's mixed precision; FSDP casts by itself)."""
        return torch.autocast(self.device.type, enabled=False)

    def clip_grad_norm(self, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def full_state_options(self) -> StateDictOptions:
        return StateDictOptions(full_state_dict=True, cpu_offload=True)

    # ---- compute ----------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, micro_batches: list[dict], fn: Callable[[torch.nn.Module, dict], Any]) -> list[Any]:
        """fn(model, micro_batch) for each micro-batch, without gradients."""
        self.ensure_on_device()
        self.module.eval()
        out = []
        with self.autocast():
            for mb in micro_batches:
                self.check_stop()
                out.append(fn(self.module, self._to_device(mb)))
        return out

    def forward_backward(self, micro_batches: list[dict], loss_fn: Callable, weights: list[float]) -> list[dict]:
        """Accumulate gradients of sum_i weights[i] * loss_fn(model, micro_i)[0]; returns each micro's metrics.

        The caller picks weights so that the sum is the mini-batch loss it wants, across ranks too:
        FSDP averages gradients over ranks, so a weight includes the world size where needed.
        """
        assert self.optimizer is not None, "forward_backward on a frozen engine"
        self.ensure_on_device()
        self.module.train()
        metrics = []
        for mb, w in zip(micro_batches, weights):
            self.check_stop()
            with self.autocast():
                loss, m = loss_fn(self.module, self._to_device(mb))
            (loss * w).backward()
            metrics.append(m)
        return metrics

    def adapter_disabled(self) -> contextlib.AbstractContextManager:
        """Context in which forward passes run the base model (peft's disable_adapter): the ref policy's
        log-probs from the actor. ValueError without an adapter."""
        if not self.lora:
            raise ValueError(
                "without_adapter: this engine trains no LoRA adapter (lora_rank 0), so its log-probs are "
                "already the base model's; ask the ref service"
            )
        return lora.peft_of(self.module).disable_adapter()

    def check_stop(self) -> None:
        """Between micro-batches: Cancelled on every rank once rank 0's caller has gone (collective)."""
        if stop_requested():
            raise Cancelled("stopped between micro-batches: the caller cancelled or its deadline passed")

    def drop_gradients(self) -> None:
        """Forget what a stopped mini-batch accumulated: no optimizer step is ever half applied."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> dict[str, float]:
        """Clip and step the optimizer; a non-finite gradient norm skips the update."""
        cfg = self.optim_cfg
        assert cfg is not None and self.optimizer is not None and self.scheduler is not None, "step on a frozen engine"
        grad_norm = self.clip_grad_norm(cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        lr = float(self.scheduler.get_last_lr()[0])
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return {"grad_norm": grad_norm, "lr": lr, "skipped": 1.0}
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "lr": lr, "skipped": 0.0}

    def end_update(self) -> None:
        """The LR schedule advances once per update (a training step, as verl counts its warm-up and
        decay), whatever its number of mini-batches and epochs."""
        assert self.scheduler is not None, "end_update on a frozen engine"
        self.scheduler.step()

    def _to_device(self, mb: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in mb.items()}

    # ---- state ------------------------------------------------------------------------

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter and persistent buffer by module name (HF names; with LoRA peft's, which
        weight_view renames), with its full shape and dtype, as this rank holds it (sharded DTensors under
        FSDP2): a push gathers them a bucket at a time (gather). Not collective."""
        return self.module.state_dict()

    def weight_view(self, keys: list[str], merged: bool) -> lora.View:
        """What leaves the engine (a push, an export) under which names, from weight_tensors()'s `keys`:
        without an adapter the weights as they are; with one the adapter alone under peft's saved names,
        or (merged) the base weights with the adapter merged in, under HF names."""
        if not self.lora:
            return lora.model_view(keys)
        if merged:
            return lora.merged_view(keys, lora.scale(self.cfg), self.expert_adapters)
        return lora.adapter_view(keys)

    def to_files(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """weight_view's tensors (HF names, as transformers holds them) under the model files' names and in
        their layout, what a push sends (meshrl/file_layout.py: a mixture of experts' fused expert tensors
        split per expert; the identity for dense models)."""
        if self._files is None:  # once: the conversions are the model's (False: it has none, a dense model)
            shell = file_layout.shell(self.config)
            self._files = shell if file_layout.converts(shell) else False
        return file_layout.to_files(self._files, named) if self._files is not False else named

    def adapter_message(self) -> rollout_pb2.LoraAdapter | None:
        """BeginWeightUpdateRequest.lora of an adapter push (None without an adapter)."""
        if self.expert_adapters:
            raise ValueError(
                "lora_experts: no rollout takes an adapter on the experts' fused tensors: push it merged "
                "(rollout.merge_lora=true)"
            )
        return lora.adapter_message(self.cfg, self.lora_targets) if self.lora else None

    def gather(self, held: dict[str, torch.Tensor], names: list[str]) -> list[torch.Tensor]:
        """Full tensors of some of weight_tensors() (`held`), where they are (the accelerator on a GPU);
        collective for sharded ones (an all-gather each, in the same order on every rank)."""
        tensors = [held[n] for n in names]
        return [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter, unsharded, on the CPU of rank 0 (other ranks: {}). Collective."""
        sd = get_model_state_dict(self.module, options=self.full_state_options())
        return cast(dict[str, torch.Tensor], sd) if self.rank == 0 else {}  # full_state_dict: plain tensors

    def save(self, path: str | pathlib.Path) -> None:
        """Sharded checkpoint (DCP) of model and optimizer, plus the schedule; with LoRA the adapter and its
        optimizer state alone (the base weights are the model folder's). Collective."""
        path = pathlib.Path(path)
        with _dcp_errors("save", path):
            dcp.save(self._dcp_state(), checkpoint_id=str(path / "dcp"))
        if self.rank == 0 and self.scheduler is not None:
            (path / "scheduler.json").write_text(json.dumps(self.scheduler.state_dict()))
        dist.barrier()

    def load(self, path: str | pathlib.Path) -> None:
        path = pathlib.Path(path)
        if not (path / "dcp").is_dir():
            raise FileNotFoundError(f"no checkpoint at {path} (expected {path / 'dcp'})")
        state = self._dcp_state()
        with _dcp_errors("load", path):
            dcp.load(state, checkpoint_id=str(path / "dcp"))
        if self.optimizer is not None:
            assert self.scheduler is not None  # made with the optimizer
            set_state_dict(
                self.module,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=StateDictOptions(strict=not self.lora),  # with LoRA the frozen base is not in it
            )
            self.scheduler.load_state_dict(json.loads((path / "scheduler.json").read_text()))
        else:
            set_state_dict(self.module, [], model_state_dict=state["model"], optim_state_dict={})

    def _dcp_state(self) -> dict:
        optimizers = [self.optimizer] if self.optimizer is not None else []
        model_sd, optim_sd = get_state_dict(
            self.module, optimizers, options=StateDictOptions(ignore_frozen_params=self.lora)
        )
        return {"model": model_sd, "optim": optim_sd} if optimizers else {"model": model_sd}

    def export_hf(self, path: str | pathlib.Path, adapter_path: str | pathlib.Path | None = None) -> None:
        """A HuggingFace folder (config, safetensors, tokenizer) that from_pretrained loads; with LoRA the base
        weights with the adapter merged in, and (adapter_path) the adapter as a peft folder too. Collective."""
        sd = self.full_state_dict()
        if self.rank == 0:
            from transformers import AutoModelForTokenClassification, AutoTokenizer

            cls = causal_class(self.config) if self.kind == "causal" else AutoModelForTokenClassification
            with torch.device("meta"):
                shell = cls.from_config(self.config)
            shell.save_pretrained(str(path), state_dict=lora.computed(self.weight_view(list(sd), merged=True), sd))
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(str(path))
            for name in PROCESSOR_FILES:  # a vision-language model's image processor goes with it
                if (pathlib.Path(self.model_path) / name).is_file():
                    shutil.copyfile(pathlib.Path(self.model_path) / name, pathlib.Path(path) / name)
            if self.lora and adapter_path is not None:
                adapter = lora.computed(self.weight_view(list(sd), merged=False), sd)
                lora.save_adapter(pathlib.Path(adapter_path), lora.peft_of(self.module), self.model_path, adapter)
        dist.barrier()

    # ---- memory -----------------------------------------------------------------------

    def offload(self) -> str:
        """Parameters, gradients and optimizer state to CPU memory (for a shared accelerator)."""
        self._move(torch.device("cpu"))
        self.on_device = False
        return "cpu"

    def reload(self) -> str:
        self._move(self.device)
        self.on_device = True
        return str(self.device)

    def ensure_on_device(self) -> None:
        """Compute after an Offload brings the model back first: a caller that never sent Reload (its
        generation failed halfway, it restarted) gets an answer, not a device mismatch."""
        if not self.on_device:
            self.reload()

    def _move(self, device: torch.device) -> None:
        self.module.to(device)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for k, v in state.items():
                    if isinstance(v, torch.Tensor):
                        state[k] = v.to(device)
