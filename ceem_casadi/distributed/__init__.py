"""Distributed CE-EM: both steps on a Dask cluster, or the smoothing step on any executor (docs/scaling.md)."""
from ._executors import Sharded, check_executor
from ._shards import shard_index

__all__ = ["Sharded", "check_executor", "shard_index"]
