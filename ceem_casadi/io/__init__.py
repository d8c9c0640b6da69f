"""Data: trajectories (arrays, simulated, or read from CSV / Parquet / npz files, validated), the real benchmarks
with their official splits and error measure, the resource policy's `InputLimitError`, and `torchfile`, a reader
of ``torch.save`` files that runs no pickled code (docs/api/io.md, docs/api/files.md)."""
from . import torchfile
from ._data import Trajectories, simulate
from ._datasets import (
    BenchmarkSplit,
    ChecksumError,
    DatasetNotFoundError,
    load_cascaded_tanks,
    load_silverbox,
    simulation_rms,
)
from ._limits import InputLimitError
from ._readers import DataFileError, read_table, read_trajectories

__all__ = ["BenchmarkSplit", "ChecksumError", "DataFileError", "DatasetNotFoundError", "InputLimitError",
           "Trajectories", "load_cascaded_tanks", "load_silverbox", "read_table", "read_trajectories", "simulate",
           "simulation_rms", "torchfile"]
