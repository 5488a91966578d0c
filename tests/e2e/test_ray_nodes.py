"""`meshrl ray` across nodes: a Ray cluster of three nodes on this machine (Ray's own multi-node test
cluster; the head on 127.0.0.1, the others on 127.0.0.2 and 127.0.0.3, each its own raylet and CPUs), so
nothing may assume one host or 127.0.0.1. GRPO with an actor of two ranks spread over two nodes
(ray.rank_strategy=STRICT_SPREAD: rank 1 joins rank 0's group over the network, behind the run's secret)
and a fleet of two rollout replicas colocated in the actor's placement group; every service on its
node's address, over mutual TLS; the placement groups released at the end. And a cluster too small for
a service gets a clear error instead of a hang. The learning claim across nodes is in
tests/e2e/test_learning.py, where it starts from that file's SFT warm-up. The cluster: tests/e2e/conftest.py."""

import json
import os

import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.ray_launch import run


def config(tiny_lm, arithmetic_data, run_dir, *extra):
    return load_config(
        None,
        [
            f"actor.model={tiny_lm}",
            f"data.train_files={arithmetic_data['train']}",
            f"trainer.run_dir={run_dir}",
            "actor.world_size=2",
            *extra,
        ],
    )


@pytest.mark.slow
def test_grpo_with_an_actor_across_two_nodes(nodes, tiny_lm, arithmetic_data, tmp_path):
    from ray.util import placement_group_table

    cfg = config(
        tiny_lm,
        arithmetic_data,
        tmp_path,
        "trainer.total_steps=2",
        "trainer.val_every=0",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.backend=hf",
        "rollout.replicas=2",
        "actor.engine=fsdp2",
        "reward.workers=1",
        "ray.rank_strategy=STRICT_SPREAD",
        "ray.colocate=[rollout]",
    )
    run_dir = run("grpo", cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["rollout/replica0/samples"] > 0 and rows[-1]["rollout/replica1/samples"] > 0
    groups = list(placement_group_table().values())
    # the actor's (two ranks, the replicas inside) and the reward's: placed, then released at the end
    assert sorted(len(g["bundles"]) for g in groups) == [1, 2] and all(g["state"] == "REMOVED" for g in groups)
    actor = next(g for g in groups if len(g["bundles"]) == 2)
    assert len(set(actor["bundles_to_node_id"].values())) == 2  # on two nodes
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    replicas = saved["rollout"]["address"].split(",")
    hosts = {a.rpartition(":")[0] for a in [saved["actor"]["address"], *replicas]}
    assert len(replicas) == 2 and len(hosts) == 1  # the replicas beside rank 0, on its node's address
    assert hosts <= {"127.0.0.1", "127.0.0.2", "127.0.0.3"}
    # over mutual TLS: the run's certificates (its clients then accept only TLS servers of the right role)
    assert (run_dir / "certs" / "ca.pem").is_file() and "MESHRL_TLS_DIR" not in os.environ


def test_a_cluster_too_small_is_named(nodes, tiny_lm, arithmetic_data, tmp_path):
    cfg = config(tiny_lm, arithmetic_data, tmp_path, "ray.cpus_per_rank=4", "ray.placement_timeout=3")
    with pytest.raises(RuntimeError, match=r"cannot place the actor service: it needs 2 bundle\(s\) of \{'CPU': 4.0\}"):
        run("grpo", cfg)
    assert all(g["state"] == "REMOVED" for g in nodes.util.placement_group_table().values())
