"""`meshrl ray` across nodes: a Ray cluster of three nodes on this machine (Ray's own multi-node test
cluster; the head on 127.0.0.1, the others on 127.0.0.2 and 127.0.0.3, each its own raylet and CPUs), so
nothing may assume one host or 127.0.0.1. GRPO with an actor of two ranks spread over two nodes
(ray.rank_strategy=STRICT_SPREAD: rank 1 joins rank 0's group over the network, behind the run's secret)
and a fleet of two rollout replicas colocated in the actor's placement group; every service on its
node's address, over mutual TLS; the placement groups released at the end. And a cluster too small for
a service gets a clear error instead of a hang. And the learning claim across nodes: the main job's
GRPO with the actor on two nodes and two replicas in groups of their own (weights by stream, down a
chain) learns by tests/e2e/test_learning.py's bar."""

import json
import os

import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.ray_launch import run


@pytest.fixture(scope="module")
def nodes():
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80_000_000)  # the head
    for ip in ("127.0.0.2", "127.0.0.3"):
        cluster.add_node(num_cpus=3, node_ip_address=ip, object_store_memory=80_000_000)
    ray.init(address=cluster.address, log_to_driver=False)
    yield ray
    ray.shutdown()
    cluster.shutdown()


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


@pytest.mark.slow
def test_grpo_across_nodes_learns_by_the_learning_tests_bar(nodes, tmp_path):
    """The main job's task and settings (tests/e2e/test_learning.py's run: the SFT warm-up, then 40 GRPO
    steps of configs/arithmetic_grpo.yaml, 500 held-out problems) with the actor's two ranks on two nodes
    and two rollout replicas each in a placement group of its own, the weights pushed by stream down a
    chain: the held-out gain reaches the learning test's bar."""
    from test_learning import COMMON, GAIN_Z, GRPO_STEPS, ROOT, learned

    from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
    from meshrl.tiny.models import TinyModelConfig, make_model
    from orchestrator.main import run as run_local
    from orchestrator.output.report import gain_line, held_out_gain

    model = make_model(tmp_path / "model", TinyModelConfig())
    data = make_data(tmp_path / "data", ArithmeticConfig())
    local = [*COMMON, f"data.train_files={data['train']}"]
    sft = run_local(
        "sft",
        load_config(
            str(ROOT / "configs/arithmetic_sft.yaml"),
            [*local, f"actor.model={model}", f"trainer.run_dir={tmp_path / 'sft'}"],
        ),
    )
    cfg = load_config(
        str(ROOT / "configs/arithmetic_grpo.yaml"),
        [
            *local,
            f"actor.model={sft / 'hf'}",
            f"data.val_files={data['test']}",
            f"trainer.run_dir={tmp_path / 'grpo'}",
            f"trainer.total_steps={GRPO_STEPS}",
            f"trainer.val_every={GRPO_STEPS}",
            "actor.engine=fsdp2",
            "actor.world_size=2",
            "ray.rank_strategy=STRICT_SPREAD",
            "rollout.replicas=2",
            "rollout.weight_transport=stream",
        ],
    )
    run_dir = run("grpo", cfg)
    gain = held_out_gain(run_dir)
    assert gain is not None and gain["n"] == 500
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    print(gain_line(gain), "| actor", saved["actor"]["address"], "| replicas", saved["rollout"]["address"])
    assert learned(gain), f"{gain_line(gain)} (the bar: {GAIN_Z} standard errors)"
