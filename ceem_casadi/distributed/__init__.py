"""Distributed CE-EM: both steps on a Dask cluster, or the smoothing step on any executor.

    Sharded            CEEMOptions(executor=Sharded(client, ...)): shards of trajectories per worker
    check_executor     what CEEMOptions accepts as ``executor``
"""
from ._executors import Sharded, check_executor
from ._shards import shard_index

__all__ = ["Sharded", "check_executor", "shard_index"]
