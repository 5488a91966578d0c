"""What every rank does for each command from rank 0: build the engine, compute, update, save.

Arguments arrive as plain values (checked on rank 0 already); results go back
as DataProtos, metrics in meta_info.
"""

import contextlib
import pathlib
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from meshrl import disk, weights
from meshrl.config.actor import EngineConfig, OptimConfig
from meshrl.dataproto import DataProto
from meshrl.delta import Base
from meshrl.errors import InvalidArgument, ServiceError
from meshrl.rpc import Client
from meshrl.rpc.token import peer_token
from meshrl.typed import build
from meshrl.v1 import rollout_pb2
from services.actor.comm import Cancelled, Group, caller_alive, stop_requested
from services.actor.engine import Engine, build_engine
from services.actor.losses import parse_loss
from services.actor.roles import KIND, ROLES, ActorRole, CriticRole, PolicyRole

ROLLOUT_SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]


class RankHandler:
    def __init__(self, role: str):
        self.role_name = role
        self.role: PolicyRole | CriticRole | None = None  # built by init (ActorRole is a PolicyRole)
        self.push_failure: ServiceError | None = None  # rank 0: the rollout's refusal of the last push
        self.push_failed: dict[str, Exception] = {}  # rank 0: replicas of a fleet that failed it (others took it)
        self.base: Base | None = None  # rank 0, delta pushes: the weights as last pushed (meshrl.delta)

    @property
    def engine(self) -> Engine:
        assert self.role is not None, "init comes first"
        return self.role.engine

    def init(self, args: dict, part=None) -> None:
        engine_cfg = build(EngineConfig, args["engine"], "engine")
        optim = build(OptimConfig, args["optim"], "optim") if self.role_name != "ref" else None
        engine = build_engine(engine_cfg, args["model"], KIND[self.role_name], optim)
        self.role = ROLES[self.role_name](engine)

    def logprobs(self, args: dict, part: DataProto) -> DataProto:
        assert isinstance(self.role, PolicyRole)  # actor and ref: the servicer asks a critic for values
        return self.role.logprobs(part, args["temperature"], args["with_entropy"], args.get("without_adapter", False))

    def values(self, args: dict, part: DataProto) -> DataProto:
        assert isinstance(self.role, CriticRole)
        return self.role.values(part)

    def update(self, args: dict, part: DataProto) -> DataProto:
        assert isinstance(self.role, ActorRole | CriticRole)  # ref is not trained
        params = parse_loss(self.role_name, args["loss"], args["params"])
        start = time.perf_counter()
        metrics = self.role.update(part, args["loss"], params, args["total_rows"], args["step"])
        metrics[f"{self.role_name}/update_seconds"] = time.perf_counter() - start  # this rank's; rank 0 reports
        return DataProto(meta_info=metrics)

    def save(self, args: dict, part=None) -> None:
        """The checkpoint at path; export_hf: the HF model at path/hf (with LoRA: merged) and, with LoRA, the
        peft adapter folder at path/hf_adapter. A full disk is DiskFull, said on the rank that met it: its own
        disk (the errno behind DCP's short write is lost on the way)."""
        path = pathlib.Path(args["path"])
        with disk.said_full(path, "the checkpoint"):
            self.engine.save(path)
            if args.get("export_hf"):
                self.engine.export_hf(path / "hf", path / "hf_adapter" if self.engine.lora else None)

    def load(self, args: dict, part=None) -> None:
        self.engine.load(args["path"])

    def push_weights(self, args: dict, part=None) -> DataProto:
        """Gather the weights bucket by bucket (collective) and, on rank 0, send each to the rollout as it is
        gathered (meshrl.weights.push_to_all): no rank holds more than one bucket of full tensors. A refusal from
        the rollout is kept in push_failure (rank 0 is the servicer's process) to reach the caller as the
        rollout said it. The push stops with its caller: every rank before each bucket, and a call to the
        rollout in flight at once (send_to_rollout).

        cuda_ipc from several ranks (a GPU each): every rank has the gathered bucket on its GPU, so each
        shares its own copy and rank 0 sends all the handles; a rollout worker on one of these GPUs
        reads it there (verl's per-device handoff), not across the GPUs.

        With a LoRA adapter only the adapter travels (peft's names, BeginWeightUpdateRequest.lora set), or
        with merge_lora the base weights with it merged in (HF names): see weight_buckets.

        delta: rank 0 keeps what it pushed (self.base) and sends only what changed since (meshrl.delta)."""
        engine = self.engine
        lora = None if args.get("merge_lora") else engine.adapter_message()
        if args.get("delta") and lora is not None:  # every rank: none may start gathering
            raise InvalidArgument(
                "a delta push sends full weights; this actor pushes its LoRA adapter alone (already small): "
                "set merge_lora, or leave delta off"
            )
        buckets, gather = weight_buckets(engine, args.get("merge_lora", False), args["dtype"], args["bucket_bytes"])
        gathered = 0

        def tensors_of(bucket) -> list:
            nonlocal gathered
            if stop_requested():  # collective: every rank asks before each bucket
                raise Cancelled(
                    f"weight push stopped before bucket {gathered + 1} of {len(buckets)}: its caller went away"
                )
            gathered += 1
            return gather(bucket)

        share = per_gpu_share(buckets) if args["transport"] == "cuda_ipc" and engine.world_size > 1 else None

        def follow(todo) -> None:  # what the other ranks do for each bucket, rank 0 alongside them
            for b in todo:
                tensors = tensors_of(b)
                if share is not None:
                    share(b, tensors)

        self.push_failure, self.push_failed = None, {}
        if engine.rank != 0:
            follow(buckets)
            return DataProto()
        try:
            self.base = (self.base or Base()) if args.get("delta") else None  # full pushes: its memory back
            more = {"lora": lora, "base": self.base}
            stats, self.push_failed = send_to_rollout({**args, **more}, buckets, tensors_of, share)
            return DataProto(meta_info=stats)
        except Cancelled:
            raise  # every rank stopped at the same bucket
        except ServiceError as e:
            self.push_failure = e
            follow(buckets[gathered:])  # the other ranks gather (and share) every bucket: stay in step
            return DataProto()
        except Exception:  # e.g. a segment refused (meshrl.shm.open_sealed): in step first, then reported
            follow(buckets[gathered:])
            raise

    def offload(self, args: dict, part=None) -> DataProto:
        return DataProto(meta_info={"device": self.engine.offload()})

    def reload(self, args: dict, part=None) -> DataProto:
        return DataProto(meta_info={"device": self.engine.reload()})


def weight_buckets(engine: Engine, merged: bool, dtype: str, bucket_bytes: int) -> tuple[list, Callable]:
    """A push's buckets (meshrl.weights.plan) and gather(bucket): the bucket's tensors, full, in its refs'
    order, cast to `dtype` where floating point (the rollout's: half the bytes; "": as held). Collective.

    The names and tensors are Engine.weight_view's: with a LoRA adapter, the adapter's alone, or (merged)
    each base weight with the adapter merged in, computed from its gathered W, lora_A and lora_B."""
    held = engine.weight_tensors()
    view = engine.weight_view(list(held), merged)
    cast = getattr(torch, dtype) if dtype else None
    # full weights travel under the model files' names and layout (a mixture of experts' fused experts split
    # per expert: Engine.to_files); an adapter alone under peft's
    to_files = engine.to_files if merged or not engine.lora else (lambda named: named)

    def sent(t: torch.Tensor) -> torch.dtype:
        return cast if cast is not None and t.dtype.is_floating_point else t.dtype

    like = {name: held[keys[0]] for name, keys in view.sources.items()}  # a merged weight: its base's shape
    source: dict[str, str] = {}  # a file's tensor -> the view's tensor it is cut from
    specs = []
    for n, t in like.items():
        for f, m in to_files({n: torch.empty(t.shape, dtype=sent(t), device="meta")}).items():
            source[f] = n
            specs.append((f, m.dtype, list(m.shape)))
    buckets = weights.plan(specs, bucket_bytes)

    def gather(bucket) -> list[torch.Tensor]:
        names = [r.name for r in bucket.refs]
        made = list(dict.fromkeys(source[f] for f in names))
        keys = list(dict.fromkeys(k for n in made for k in view.sources[n]))  # every rank: the same order
        got = dict(zip(keys, engine.gather(held, keys)))
        computed = {
            n: view.compute(n, [got[k] for k in view.sources[n]]).to(sent(got[view.sources[n][0]])) for n in made
        }
        files = to_files(computed)
        return [files[f] for f in names]

    return buckets, gather


def send_to_rollout(
    args: dict, buckets: list, tensors_of: Callable, share: Callable | None
) -> tuple[dict, dict[str, Exception]]:
    """Rank 0's side of a push (meshrl.weights.push_to_all) to args["rollout_addresses"]: each call to a
    rollout has a deadline scaled by its bytes and bounded by the caller's (args["seconds_left"]; None: the
    caller set none). Returns the push's stats and {address: error} of the replicas that failed."""
    left = args.get("seconds_left")
    deadline = time.monotonic() + left if left is not None else None
    total = sum(b.size for b in buckets)
    timeout = weights.call_timeout(total, deadline)
    with contextlib.ExitStack() as stack:
        rollouts = [
            stack.enter_context(Client(a, ROLLOUT_SERVICE, timeout=timeout, token=peer_token()))
            for a in args["rollout_addresses"]
        ]
        stack.enter_context(cut_when_caller_leaves(rollouts))
        push = weights.Push(
            args["version"],
            args["transport"],
            deadline,
            args.get("rollback", False),
            args.get("lora"),
            share,
            args.get("relay", False),
            base=args.get("base"),
            delta=args.get("base") is not None,
        )
        stats, failed = weights.push_to_all(rollouts, buckets, tensors_of, push)
    return stats, failed


@contextlib.contextmanager
def cut_when_caller_leaves(clients: list[Client]):
    """Close the clients' channels (which ends their calls in flight, CANCELLED) once the push's caller is
    gone: a stalled rollout must not hold the actor, and every call behind it, until a deadline."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            if not caller_alive():
                for client in clients:
                    client.close()
                return

    watcher = threading.Thread(target=watch, name="push-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def per_gpu_share(buckets: list) -> Callable:
    """share(bucket, tensors) for meshrl.weights.push_to_all, called by every rank in step: each copies the bucket
    into its own reused CUDA buffer and shares it; rank 0 gets every rank's handle, its own first."""
    from meshrl.cuda_ipc import CudaBucket

    staging, group, first = CudaBucket(max(b.size for b in buckets)), Group(), True

    def share(bucket, tensors: list) -> list:
        nonlocal first
        if not first:
            # rank 0 asks for the next bucket only after the rollout loaded the last (SendWeights returns
            # then): until every rank is past this point, no buffer may be refilled. NCCL all-gathers
            # return before they finish, so the gather above is no such point.
            dist.barrier()
        first = False
        handles = group.gather(staging.fill(tensors, bucket).SerializeToString())
        return [rollout_pb2.CudaIpcHandle.FromString(h) for h in handles] if handles is not None else []

    return share
