"""Codec benchmark: a 64 MiB DataProto through the wire codec, in process and over loopback gRPC.

Baselines in the same run: np.copy of the same bytes (the memory-bandwidth limit
here), torch.save/torch.load through BytesIO (what verl ships between workers),
plain protobuf (tobytes into Tensor.data, serialize, parse), and gRPC's own
ceiling (the same stream of prebuilt bytes to a handler that only counts them).

    .venv/bin/python bench/codec_bench.py [--repeats 9]

Prints a markdown table for bench/RESULTS.md: GB/s of batch bytes (higher is
better), medians over the repeats. The servers run in their own process, as in
a real mesh (one process would share one GIL between client and server).
"""

import argparse
import io
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures

import grpc
import numpy as np
import torch

import meshrl.codec.payload as payload_mod
from meshrl.codec import Payload, decode_dataproto, encode_dataproto, split_rows
from meshrl.codec.dtypes import TO_WIRE
from meshrl.dataproto import DataProto
from meshrl.rpc import Client, serve
from meshrl.rpc.server import channel_options
from meshrl.v1 import data_pb2 as pb
from meshrl.v1 import reward_pb2

SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]
SCORE = f"/{SERVICE.full_name}/Score"


def batch() -> DataProto:
    rows, cols = 8192, 512
    return DataProto(
        {
            "input_ids": torch.randint(0, 32000, (rows, cols)),  # 32 MiB int64
            "rollout_logprobs": torch.randn(rows, cols),  # 16 MiB float32
            "values": torch.randn(rows, cols).bfloat16(),  # 8 MiB bfloat16
            "attention_mask": torch.rand(rows, cols) > 0.1,  # 4 MiB bool
            "response_mask": torch.randint(0, 2, (rows, cols // 2), dtype=torch.int32),  # 8 MiB int32
        }
    )


def timed(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):  # first touch of fresh pages; HTTP/2 flow-control windows grow
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def meshrl_roundtrip(data):
    buf = b"".join(encode_dataproto(data))  # encode + serialize (the one copy)
    return decode_dataproto(buf)[0]  # parse + decode (views into buf)


def torch_roundtrip(data):
    f = io.BytesIO()
    torch.save(data.batch, f)
    f.seek(0)
    return torch.load(f, weights_only=True)


def protobuf_roundtrip(data):
    msg = pb.DataProto(num_rows=len(data))
    for k, t in data.batch.items():
        msg.tensors.add(name=k, dtype=TO_WIRE[t.dtype], shape=list(t.shape), data=t.view(torch.uint8).numpy().tobytes())
    back = pb.DataProto.FromString(msg.SerializeToString())
    return {t.name: torch.frombuffer(bytearray(t.data), dtype=torch.uint8) for t in back.tensors}


class Sink:
    """Takes the whole batch, answers with nothing: the request direction alone."""

    SERVICE = SERVICE

    def Score(self, request, context):
        return Payload(reward_pb2.ScoreResponse(metrics={"rows": len(request.data)}))


class Echo:
    SERVICE = SERVICE

    def Score(self, request, context):
        return Payload(reward_pb2.ScoreResponse(), request.data)


def run_server(kind: str, port_file: str) -> None:
    if kind != "raw":
        server = serve(Sink() if kind == "sink" else Echo())
        pathlib.Path(port_file).write_text(str(server.port))
        server.run_until_signal(grace=0)
        return
    raw = grpc.server(futures.ThreadPoolExecutor(4), options=channel_options())
    count: grpc.RpcMethodHandler[bytes, bytes] = grpc.stream_unary_rpc_method_handler(
        lambda parts, ctx: str(sum(map(len, parts))).encode()
    )
    raw.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, {"Score": count}),))
    port = raw.add_insecure_port("127.0.0.1:0")
    raw.start()
    pathlib.Path(port_file).write_text(str(port))
    raw.wait_for_termination()


def start_server(kind: str, chunk_mb: int) -> tuple[subprocess.Popen, str]:
    port_file = pathlib.Path(tempfile.mkdtemp()) / "port"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--chunk-mb", str(chunk_mb), "--port-file", str(port_file)]
    )
    while not (port_file.exists() and port_file.read_text()):
        if proc.poll() is not None:
            raise RuntimeError("benchmark server died")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--serve", choices=["raw", "sink", "echo"], help=argparse.SUPPRESS)
    ap.add_argument("--chunk-mb", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    payload_mod.CHUNK_BYTES = args.chunk_mb << 20
    if args.serve:
        return run_server(args.serve, args.port_file)

    data = batch()
    size = sum(t.numel() * t.element_size() for t in data.batch.values())
    flat = np.concatenate([t.contiguous().view(torch.uint8).numpy().ravel() for t in data.batch.values()])
    rows = []

    def add(name, seconds, note=""):
        rows.append((name, size / seconds / 1e9, note))

    add("np.copy of the same bytes (limit)", timed(lambda: np.copy(flat), args.repeats))
    add("meshrl codec: encode+serialize+parse+decode", timed(lambda: meshrl_roundtrip(data), args.repeats))
    add("torch.save + torch.load via BytesIO", timed(lambda: torch_roundtrip(data), args.repeats))
    add("plain protobuf (tobytes, serialize, parse)", timed(lambda: protobuf_roundtrip(data), args.repeats))

    req = Payload(reward_pb2.ScoreRequest(), data)
    for kind, chunk_mb in (("raw", 4), ("sink", 1), ("sink", 2), ("sink", 4), ("echo", 4)):
        payload_mod.CHUNK_BYTES = chunk_mb << 20
        parts = list(split_rows(req))
        proc, address = start_server(kind, chunk_mb)
        try:
            if kind == "raw":
                with grpc.insecure_channel(address, options=channel_options()) as ch:
                    call: grpc.StreamUnaryMultiCallable[bytes, bytes] = ch.stream_unary(SCORE)  # bytes both ways
                    seconds = timed(lambda: call(iter(parts), timeout=120), args.repeats)  # noqa: B023 - called at once, in the loop
                add("gRPC ceiling: prebuilt 4 MiB messages to a byte-counting handler", seconds)
                continue
            with Client(address, SERVICE, timeout=120) as c:
                c.wait_ready(30)
                seconds = timed(lambda: c.call("Score", req), args.repeats)
        finally:
            proc.terminate()
            proc.wait()
        if kind == "sink":
            add(f"meshrl Client -> server process, {chunk_mb} MiB chunks", seconds, f"{len(parts)} messages")
        else:
            add(f"meshrl echo, batch there and back, {chunk_mb} MiB chunks", seconds / 2, "per direction")

    print(
        f"DataProto of {size / 2**20:.0f} MiB ({len(data)} rows, 5 tensors), median of {args.repeats}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    print("| path | GB/s | x np.copy |  |\n|---|---|---|---|")
    for name, gbs, note in rows:
        print(f"| {name} | {gbs:.2f} | {gbs / rows[0][1]:.2f} | {note} |")


if __name__ == "__main__":
    main()
