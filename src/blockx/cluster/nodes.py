"""The node workers of a cluster: one :class:`~blockx.cluster.node.NodeWorker` actor per Ray node.

Theory of operation
-------------------
A :class:`NodePool` keeps one node worker per alive Ray node with CPUs: :meth:`NodePool.watch`
looks at ``ray.nodes()``, starts an actor (pinned to its node by
``NodeAffinitySchedulingStrategy(node, soft=False)``, reserving no CPU itself: its
executors use them) on every node that has none yet, and notes the starts that ended --
a start that failed is not tried again on that node (:attr:`NodePool.start_error` says
why). A node worker hosts many driver tasks at once (one stream each, by key), so one
pool can serve one driver (``blockx run --ray``: the driver's own, closed with it) or
every driver of a service (``blockx serve --ray``: the service's, the actors living as
long as the service). Which nodes a driver *uses*, and losing them, is the driver's own
bookkeeping (:class:`~blockx.cluster.placement.Placement`); the pool only starts and
stops actors.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, Final

from blockx.cluster.node import node_worker_class

__all__ = [
    "NodePool",
    "PooledNode",
    "RayMissing",
    "alive_ray_nodes",
    "init_ray",
    "is_node_error",
    "ray_available",
]

_log = logging.getLogger("blockx.cluster")


class RayMissing(RuntimeError):
    """``ray`` cannot be imported."""


def ray_available() -> bool:
    """Whether ``ray`` can be imported (``pip install 'blockx[ray]'``)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


#: Ray's settings for a local instance started by ``--ray auto`` (:func:`init_ray`): no
#: idle worker prestarted (the node worker is the only actor; its executors are its own
#: children), no metrics collection or task events (nobody reads them, and their agents'
#: reporting took CPU from the executors on a small machine).
AUTO_SYSTEM_CONFIG: Final[dict[str, Any]] = {
    "prestart_worker_first_driver": False,
    "enable_worker_prestart": False,
    "enable_metrics_collection": False,
    "task_events_report_interval_ms": 0,
}


def init_ray(address: str) -> bool:
    """Join (or start, ``auto``) Ray; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    quiet = logging.getLogger("ray")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its start-up notes would be mixed into the CLI's stderr
    try:
        if address == "auto":  # always a fresh local instance, never a stale one's address
            ray.init(
                address="local",
                include_dashboard=False,
                _system_config=dict(AUTO_SYSTEM_CONFIG),
                **kwargs,
            )
        else:
            ray.init(address=address, **kwargs)
    finally:
        quiet.setLevel(level)
    return True


def is_node_error(exc: BaseException) -> bool:
    """Whether ``exc`` (a method call's) means the node or its actor is gone."""
    import ray.exceptions as rex

    return isinstance(
        exc,
        (rex.RayActorError, rex.ActorDiedError, rex.NodeDiedError, rex.ObjectLostError),
    )


def alive_ray_nodes() -> dict[str, int]:
    """Alive Ray nodes with CPUs: ``{node_id: cpus}``."""
    import ray

    alive: dict[str, int] = {}
    for n in ray.nodes():  # type: ignore[no-untyped-call]
        cpus = int(n.get("Resources", {}).get("CPU", 0))
        if n.get("Alive") and cpus > 0:
            alive[n["NodeID"]] = cpus
    return alive


class PooledNode:
    """One node's worker actor (None: it did not start) and its executors."""

    __slots__ = ("actor", "executors", "node_id")

    def __init__(self, node_id: str, actor: Any, executors: int) -> None:
        self.node_id = node_id
        self.actor = actor
        self.executors = executors

    def __repr__(self) -> str:
        state = "started" if self.actor is not None else "failed"
        return f"PooledNode({self.node_id[:8]}, executors={self.executors}, {state})"


class NodePool:
    """One node worker per Ray node (see the module docstring)."""

    def __init__(self, worker_config: Any, io_config: Any, executors_per_node: int | None) -> None:
        self.worker_config = worker_config
        self.io_config = io_config
        self.executors_per_node = executors_per_node
        #: Started (or failed: ``actor`` None) node workers, by node id.
        self.nodes: dict[str, PooledNode] = {}
        self.starting: dict[str, asyncio.Task[PooledNode]] = {}
        self.start_error: str | None = None
        #: The alive Ray nodes as last seen (``{node_id: cpus}``).
        self.alive: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"NodePool(nodes={len(self.ready())}, starting={len(self.starting)})"

    def ready(self) -> list[PooledNode]:
        """The started node workers on nodes alive when last seen."""
        return [n for n in self.nodes.values() if n.actor is not None and n.node_id in self.alive]

    async def _start(self, node_id: str, cpus: int) -> PooledNode:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        executors = self.executors_per_node or cpus
        config = replace(
            self.worker_config, pool=replace(self.worker_config.pool, executor_count=executors)
        )
        actor = (
            node_worker_class()
            .options(
                num_cpus=0,
                max_restarts=0,
                # Task events per method call: nobody reads them (the driver counts).
                enable_task_events=False,
                max_concurrency=10_000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(node_id, config, self.io_config)
        )
        await actor.start.remote()
        node = PooledNode(node_id, actor, executors)
        self.nodes[node_id] = node
        return node

    async def watch(self) -> dict[str, int]:
        """Look at the Ray nodes: start a worker on every new one, note the starts that
        ended. Returns the alive nodes."""
        alive = self.alive = await asyncio.to_thread(alive_ray_nodes)
        loop = asyncio.get_running_loop()
        for node_id, cpus in alive.items():
            if node_id not in self.nodes and node_id not in self.starting:
                self.starting[node_id] = loop.create_task(self._start(node_id, cpus))
        for node_id, start in list(self.starting.items()):
            if start.done():
                del self.starting[node_id]
                exc = None if start.cancelled() else start.exception()
                if exc is not None or start.cancelled():
                    self.start_error = f"node {node_id[:8]}: {type(exc).__name__}: {exc}"
                    _log.warning("node %s: its worker did not start: %r", node_id[:8], exc)
                    self.nodes.setdefault(node_id, PooledNode(node_id, None, 0))  # not again
        return alive

    async def wait_started(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for the starts under way, then look again."""
        if self.starting:
            await asyncio.wait(list(self.starting.values()), timeout=timeout)
            await self.watch()

    def forget(self, node_id: str) -> None:
        """A driver lost the node's worker (its actor died, or the node): the next
        :meth:`watch` starts a new one if the Ray node is alive (for later drivers: a
        driver never takes back a node it lost)."""
        node = self.nodes.pop(node_id, None)
        if node is not None and node.actor is not None:
            import ray

            try:
                ray.kill(node.actor)
            except Exception:
                pass

    async def close(self) -> None:
        """Stop every node worker (their tasks are cancelled) and kill the actors."""
        import ray

        for start in self.starting.values():
            start.cancel()
        for node in self.nodes.values():
            if node.actor is None:
                continue
            try:
                await asyncio.wait_for(node.actor.close.remote(), 10.0)
            except Exception:
                pass
            try:
                ray.kill(node.actor)
            except Exception:
                pass
        self.nodes.clear()
