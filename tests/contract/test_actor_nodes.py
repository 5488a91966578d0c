"""An actor service whose two ranks live on two "nodes" (loopback addresses 127.0.0.2 and 127.0.0.3): rank 0
starts no local rank (--local-ranks 1) and opens the group's TCP store on its node's address; rank 1 is
started apart, as `meshrl ray` starts it on its own node, and joins with the run's secret. The group then
computes what a one-host group computes: log-probs equal to transformers' own, and an update that moves
the weights."""

import os
import subprocess
import sys

import torch
from actor_process import Service, batch, hf_logprobs

from meshrl.group import GROUP_SECRET_VAR, free_port, node_env

TOLERANCE = 1e-4  # FSDP2 over two ranks against one process's forward (measured ~1e-6)


def test_ranks_on_two_nodes_form_one_group(tiny_lm, monkeypatch):
    secret = os.urandom(16).hex()
    group = f"127.0.0.2:{free_port('127.0.0.2')}"
    monkeypatch.setenv(GROUP_SECRET_VAR, secret)
    remote = subprocess.Popen(  # rank 1, "on 127.0.0.3": started before rank 0, as nodes start in any order
        [sys.executable, "-m", "services.actor.rank", "actor"],
        env={**os.environ, **node_env(1, 0, 2, group, secret, "127.0.0.3"), "OMP_NUM_THREADS": "1"},
    )
    try:
        actor = Service(
            "--model", str(tiny_lm), "--world-size", "2", "--local-ranks", "1", "--host", "127.0.0.2",
            "--group-port", group.rpartition(":")[2], "--engine", "fsdp2", "--lr", "1e-2", "--threads", "1",
        )  # fmt: skip
        try:
            info = actor.call("Describe")
            assert info.world_size == 2 and info.backend == "fsdp2"
            data = batch()
            mask = data.batch["response_mask"]
            ours = actor.logprobs(data)
            assert ((ours - hf_logprobs(tiny_lm, data)).abs() * mask).max() < TOLERANCE
            actor.update(1, "sft", data)
            assert not torch.allclose(actor.logprobs(data), ours)  # both ranks stepped their shards
        finally:
            actor.stop()
        assert remote.wait(60) == 0  # rank 0 told it to stop
    finally:
        if remote.poll() is None:
            remote.kill()


def test_hsdp_shards_within_a_node_and_replicates_across_nodes(tiny_lm, monkeypatch):
    """Four ranks, two per node, numbered node by node (as `meshrl ray` numbers them), with
    --hsdp-replicate 2. init_device_mesh lays ranks out row by row over (replicate, shard), so the shard
    groups are ranks 0-1 (127.0.0.2) and 2-3 (127.0.0.3): each parameter is sharded within a node and
    replicated across the nodes. What is checked: such a group starts across the nodes, computes
    transformers' log-probs, and an update moves the weights."""
    secret = os.urandom(16).hex()
    group = f"127.0.0.2:{free_port('127.0.0.2')}"
    monkeypatch.setenv(GROUP_SECRET_VAR, secret)
    remote = [
        subprocess.Popen(
            [sys.executable, "-m", "services.actor.rank", "actor"],
            env={**os.environ, **node_env(rank, rank - 2, 4, group, secret, "127.0.0.3"), "OMP_NUM_THREADS": "1"},
        )
        for rank in (2, 3)
    ]
    try:
        actor = Service(
            "--model", str(tiny_lm), "--world-size", "4", "--local-ranks", "2", "--host", "127.0.0.2",
            "--group-port", group.rpartition(":")[2], "--engine", "fsdp2", "--hsdp-replicate", "2",
            "--lr", "1e-2", "--threads", "1",
        )  # fmt: skip
        try:
            assert actor.call("Describe").world_size == 4
            data = batch()
            mask = data.batch["response_mask"]
            ours = actor.logprobs(data)
            assert ((ours - hf_logprobs(tiny_lm, data)).abs() * mask).max() < TOLERANCE
            actor.update(1, "sft", data)
            assert not torch.allclose(actor.logprobs(data), ours)
        finally:
            actor.stop()
        assert [p.wait(60) for p in remote] == [0, 0]
    finally:
        for p in remote:
            if p.poll() is None:
                p.kill()
