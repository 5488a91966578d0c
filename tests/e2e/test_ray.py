"""`meshrl ray`: a local Ray cluster on 127.0.0.1 places the services (a placement group per service,
a fleet of two rollout replicas colocated in the actor's), the orchestrator trains through their gRPC addresses;
a cluster too small for a service gets a clear error instead of a hang."""

import json
import os

import pytest

from orchestrator.config import load_config
from orchestrator.ray_launch import run


@pytest.fixture(scope="module")
def cluster():
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled")  # 127.0.0.1 only
    import ray

    ray.init(num_cpus=6, include_dashboard=False, object_store_memory=100_000_000, log_to_driver=False)
    yield ray
    ray.shutdown()


def config(tiny_lm, arithmetic_data, run_dir, *extra):
    return load_config(
        None,
        [
            f"actor.model={tiny_lm}",
            f"data.train_files={arithmetic_data['train']}",
            f"trainer.run_dir={run_dir}",
            "trainer.total_steps=2",
            "data.train_batch_size=4",
            "rollout.n=2",
            "rollout.backend=hf",
            "actor.engine=fsdp2",
            "actor.world_size=2",
            "reward.workers=1",
            *extra,
        ],
    )


@pytest.mark.slow
def test_grpo_runs_on_services_placed_by_ray(cluster, tiny_lm, arithmetic_data, tmp_path):
    from ray.util import placement_group_table

    run_dir = run("grpo", config(tiny_lm, arithmetic_data, tmp_path, "ray.colocate=[rollout]", "rollout.replicas=2"))
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    saved = (run_dir / "config.yaml").read_text()
    assert "address: 127.0.0.1:" in saved  # the trainer used the services Ray placed
    rollout = load_config(str(run_dir / "config.yaml"), []).rollout  # a fleet of two, both in the actor's group
    assert len(rollout.address.split(",")) == 2 and rollout.replicas == 2
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["rollout/replica0/samples"] > 0 and last["rollout/replica1/samples"] > 0
    # over mutual TLS: the run's certificates (its clients then accept only TLS servers of the right role)
    assert (run_dir / "certs" / "ca.pem").is_file() and "MESHRL_TLS_DIR" not in os.environ
    groups = placement_group_table().values()
    # actor (2 bundles, the rollout inside) and reward: placed, then released at the end
    assert sorted(len(g["bundles"]) for g in groups) == [1, 2]
    assert all(g["state"] == "REMOVED" for g in groups)


def test_a_cluster_too_small_is_named(cluster, tiny_lm, arithmetic_data, tmp_path):
    cfg = config(tiny_lm, arithmetic_data, tmp_path, "ray.cpus_per_rank=4", "ray.placement_timeout=3")
    with pytest.raises(RuntimeError, match=r"cannot place the actor service: it needs 2 bundle\(s\) of \{'CPU': 4.0\}"):
        run("grpo", cfg)
    assert all(g["state"] == "REMOVED" for g in cluster.util.placement_group_table().values())
