"""One real Ray cluster for every test in this directory: a head and a second node on loopback.

Started once per session with `ray start` (token authentication on, 2 logical CPUs and a
200 MB object store per node, no dashboard), joined by this test process as the driver, and
torn down at the end; the teardown fails the session if any process of the cluster survives.
Ray reads its token settings when first imported, so they go into the environment before that.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from agentrl.ray.cluster import LoopbackCluster

HAVE_RAY = importlib.util.find_spec("ray") is not None
collect_ignore_glob = [] if HAVE_RAY else ["test_*.py"]  # without the ray extra: nothing to run

CLUSTER = LoopbackCluster(nodes=2, cpus_per_node=2)
os.environ.update(CLUSTER.env)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    try:
        CLUSTER.start()
        ray.init(address=CLUSTER.address, configure_logging=False, log_to_driver=False)
        yield CLUSTER
    finally:
        ray.shutdown()
        CLUSTER.stop()
    assert not CLUSTER.processes(), f"Ray processes left behind: {CLUSTER.processes()}"


def pytest_sessionfinish(session, exitstatus):
    CLUSTER.stop()  # idempotent: also removes the token's temp dir when no test used the cluster
