"""Fixtures the end-to-end files share: a Ray cluster of three nodes on this machine."""

import os

import pytest


@pytest.fixture(scope="module")
def nodes():
    """Ray's own multi-node test cluster: the head on 127.0.0.1 (1 CPU), nodes on 127.0.0.2 and 127.0.0.3
    (3 CPUs each), each its own raylet, so nothing may assume one host."""
    # Ray's memory monitor kills a worker (a ServiceHost, and the ranks it started with it) once the host's
    # memory passes 95%, which the suite's other xdist worker can push it to for a moment; off, as for every
    # test outside Ray, the kernel decides at real exhaustion. (CI once saw an actor rank on another node
    # vanish mid-push, "Connection reset by peer", with no word on why: a failed step now names what exited.)
    os.environ.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled", RAY_memory_monitor_refresh_ms="0"
    )
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
