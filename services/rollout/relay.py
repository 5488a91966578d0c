"""Forwarding a weight bucket down a chain of rollout replicas (WeightBucket.relay_to).

A fleet across hosts takes a stream push as a chain: the sender sends each bucket
to the first replica only, and each replica passes the call's messages on to the
next one as they arrive, while it stages and loads its own copy. So R hosts cost
about one push plus a bucket's last chunk per hop, not R pushes from the sender.

The messages go on as the bytes they came in, but for the first, which names the
rest of the chain (relay_to[1:]). A bounded queue between the receiving thread and
the forwarding call holds a few chunks, so a slow next hop slows this one instead of
piling the bucket up in memory. A hop that fails does not fail this replica: the
reply names it and every replica after it (relay_missed), and the sender sends the
bucket to those itself.
"""

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import cast

from meshrl.codec.rawbytes import decode_bytes_field, encode_bytes_field
from meshrl.rpc import Client
from meshrl.rpc.token import peer_token
from meshrl.v1 import rollout_pb2

SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
DEPTH = 4  # messages (chunks of ~4 MiB) held between this hop and the next
_END, _ABORT = object(), object()


class Relay:
    """One SendWeights call's forwarding: tee(parts) passes the messages through and on to the next hop
    (if the first names one); result() waits for the hop and says who down the chain missed the bucket."""

    def __init__(self, clients: dict[str, Client], timeout: float | None):
        self.clients, self.timeout = clients, timeout  # clients: kept across calls, one per next hop
        self.chain: list[str] = []
        self.queue: queue.Queue = queue.Queue(DEPTH)
        self.thread: threading.Thread | None = None
        self.reply: rollout_pb2.WeightUpdateStatus | None = None
        self.error: Exception | None = None
        self.broke = False  # the incoming stream itself failed: the next hop was told to drop the bucket

    def tee(self, parts: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for i, part in enumerate(parts):
                if i == 0:
                    self._start(part)
                elif self.thread is not None:
                    self._put(part)
                yield part
        except BaseException:
            self.broke = True
            self._put(_ABORT)  # the bucket broke off here: the next must not take a torn bucket
            raise
        self._put(_END)

    def drain(self, teed: Iterator[bytes]) -> bool:
        """After this hop failed on its own (its base, its engine), the rest of the bucket still goes down
        the chain: the replicas below took nothing wrong. False where there is no chain to pass it to, or the
        incoming stream itself broke."""
        if not self.chain or self.broke:
            return False
        for _ in teed:
            pass
        return True

    def result(self) -> tuple[list[str], str]:
        """(the addresses that did not get the bucket, why); ([], "") without a chain or when all did."""
        if self.thread is None:
            return [], ""
        self.thread.join()
        if self.error is not None:
            return self.chain, f"{self.chain[0]}: {self.error}"
        assert self.reply is not None  # the thread ends with a reply or an error
        return list(self.reply.relay_missed), self.reply.relay_error

    def _start(self, first: bytes) -> None:
        decoded, data = decode_bytes_field(rollout_pb2.WeightBucket, first, "data")
        msg = cast(rollout_pb2.WeightBucket, decoded)
        if not msg.relay_to:
            return
        self.chain = list(msg.relay_to)
        del msg.relay_to[0]  # what the next hop passes on
        head = encode_bytes_field(msg, "data", [data])
        self.thread = threading.Thread(target=self._forward, args=(head,), name="meshrl-relay", daemon=True)
        self.thread.start()

    def _put(self, item) -> None:
        while self.thread is not None and self.thread.is_alive():  # a dead hop takes nothing more
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _messages(self, head: bytes) -> Iterator[bytes]:
        yield head
        while (item := self.queue.get()) is not _END:
            if item is _ABORT:
                raise RuntimeError("the bucket broke off upstream")  # grpc cancels the call
            yield item

    def _forward(self, head: bytes) -> None:
        address = self.chain[0]
        try:
            client = self.clients.get(address)
            if client is None:
                client = self.clients[address] = Client(address, SERVICE, token=peer_token())
            reply = client.call_stream("SendWeights", self._messages(head), timeout=self.timeout)
            self.reply = cast(rollout_pb2.WeightUpdateStatus, reply)
        except Exception as e:  # a ServiceError, or no channel at all: this hop missed it, not us
            self.error = e
