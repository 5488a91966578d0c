"""A streamed batch's memory follows the bytes that came in, not the row count its first part declares
(issue 27, item 12): two 68-byte parts declaring 2^27 rows once took 1 GiB of a server's memory, and
2^40 rows gave INTERNAL. Past the declared-size limit is INVALID_ARGUMENT naming `total_rows`."""

import pathlib
import re

import grpc
import pytest
import torch

from meshrl.codec import Assembler, encode_message
from meshrl.codec.payload import MAX_BATCH_BYTES
from meshrl.dataproto import DataProto
from meshrl.rpc import serve
from meshrl.v1 import reward_pb2
from testkit.echo import EchoScorer


def status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", pathlib.Path("/proc/self/status").read_text()).group(1))


def reset_peak_rss() -> None:
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the current RSS


def declaring(total_rows: int, parts: int = 2) -> list[bytes]:
    """`parts` one-row messages (a tensor and a column, ~70 bytes each) of a stream declaring total_rows."""
    return [
        encode_message(
            reward_pb2.ScoreRequest(),
            DataProto({"x": torch.ones(1, 1)}, {"uid": ["a"]}),
            row_offset=i,
            total_rows=total_rows,
        )
        for i in range(parts)
    ]


def test_memory_follows_the_rows_received_not_the_declared_count():
    parts = declaring(2**27)
    assert max(map(len, parts)) < 100
    before = status_kib("VmRSS")
    asm = Assembler(reward_pb2.ScoreRequest)
    for p in parts:
        asm.add(p)
    assert status_kib("VmRSS") - before < 200 * 1024  # was 1 GiB: an object array of 2^27 rows, filled
    with pytest.raises(ValueError, match=r"stream ended after 2 of 134217728 rows \(truncated\)"):
        asm.result()


def test_a_declared_size_past_the_limit_names_total_rows():
    asm = Assembler(reward_pb2.ScoreRequest)
    with pytest.raises(ValueError, match=r"data.total_rows = 1099511627776 .* past this service's limit"):
        asm.add(declaring(2**40, 1)[0])
    small = Assembler(reward_pb2.ScoreRequest, max_bytes=1000)  # the limit counts declared rows' bytes
    with pytest.raises(ValueError, match="data.total_rows = 100 "):
        small.add(declaring(100, 1)[0])
    assert 2**27 * 12 < MAX_BATCH_BYTES < 2**40  # 2^27 rows of 12 bytes are within it: the test above grows


def test_growing_buffers_keep_every_row():
    rows = [3, 1, 7, 2, 40, 5]  # parts of uneven sizes: the buffers grow several times
    total = sum(rows)
    x = torch.randn(total, 3)
    asm, start = Assembler(reward_pb2.ScoreRequest), 0
    for n in rows:
        part = DataProto(
            {"x": x[start : start + n]},
            {"uid": [f"u{i}" for i in range(start, start + n)]},
            {"first": 1} if start == 0 else {},
        )
        asm.add(encode_message(reward_pb2.ScoreRequest(), part, row_offset=start, total_rows=total))
        start += n
    out = asm.result().data
    assert torch.equal(out.batch["x"], x) and out.batch["x"].shape == (total, 3)
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(total)]
    assert out.meta_info["first"] == 1


@pytest.mark.parametrize("total_rows,match", [(2**27, "truncated"), (2**40, "data.total_rows = 1099511627776")])
def test_a_server_answers_invalid_argument_without_the_memory(total_rows, match):
    server = serve(EchoScorer())
    try:
        reset_peak_rss()
        before = status_kib("VmHWM")
        with grpc.insecure_channel(server.address) as ch:
            with pytest.raises(grpc.RpcError) as e:
                list(ch.stream_stream("/meshrl.v1.RewardService/Score")(iter(declaring(total_rows)), timeout=30))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert match in e.value.details()
        assert status_kib("VmHWM") - before < 200 * 1024  # the peak, not only what is left after the call
    finally:
        server.stop(0)


def test_a_caller_that_cancels_mid_stream_is_no_error_on_the_server(caplog):
    """A caller gone mid-request (Ctrl-C, a deadline) is the caller's doing: the server logs one line at
    info, not ERROR with a traceback (the second-Ctrl-C test once read one on the terminal)."""
    import threading

    server = serve(EchoScorer())
    sent, cancelled = threading.Event(), threading.Event()
    parts = declaring(4, parts=1)

    def requests():
        yield parts[0]
        sent.set()
        cancelled.wait(10)  # the stream stays open until the call is cancelled

    try:
        with caplog.at_level("INFO"), grpc.insecure_channel(server.address) as ch:
            call = ch.stream_stream("/meshrl.v1.RewardService/Score")(requests(), timeout=30)
            assert sent.wait(10)
            call.cancel()
            cancelled.set()
            with pytest.raises(grpc.RpcError):
                list(call)
            for _ in range(100):  # the server notices on its own thread
                if any("went away" in r.getMessage() for r in caplog.records):
                    break
                threading.Event().wait(0.05)
        assert any("went away" in r.getMessage() for r in caplog.records), caplog.text
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
        assert "Traceback" not in caplog.text
    finally:
        server.stop(0)
