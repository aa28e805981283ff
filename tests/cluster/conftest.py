"""Fixtures of the cluster tests: ONE simulated Ray cluster per module (several raylets
on loopback, ``num_cpus=1`` each: start-up takes seconds), a PostgreSQL server.

Ray is an optional extra (``blockx[ray]``; ``make test`` installs it): without it these
tests are skipped with that reason -- never otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "io"))

from pg_cluster import pg_dsn  # noqa: F401 - the shared session fixture

RAY_MISSING = "ray is not installed: pip install 'blockx[ray]'"


class SimCluster:
    """A ``ray.cluster_utils.Cluster``, the driver connected to it."""

    def __init__(self, nodes: int) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        self.extra: list[Any] = [self.cluster.add_node(num_cpus=1) for _ in range(nodes - 1)]
        ray.init(address=self.cluster.address, log_to_driver=False, logging_level="ERROR")
        self.cluster.wait_for_nodes()

    def __repr__(self) -> str:
        return f"SimCluster({self.cluster.address}, extra={len(self.extra)})"

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self) -> Any:
        node = self.cluster.add_node(num_cpus=1)
        self.extra.append(node)
        return node

    def remove_node(self, node: Any) -> None:
        self.extra.remove(node)
        self.cluster.remove_node(node)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


def _cluster_of(nodes: int) -> Iterator[SimCluster]:
    pytest.importorskip("ray", reason=RAY_MISSING)
    cluster = SimCluster(nodes)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def sim_cluster() -> Iterator[SimCluster]:
    """A module's simulated cluster of 3 raylets."""
    yield from _cluster_of(3)


@pytest.fixture(scope="module")
def cluster2() -> Iterator[SimCluster]:
    """A module's simulated cluster of 2 raylets."""
    yield from _cluster_of(2)


@pytest.fixture(scope="module")
def cluster1() -> Iterator[SimCluster]:
    """A module's simulated cluster of 1 raylet (tests add nodes to it)."""
    yield from _cluster_of(1)
