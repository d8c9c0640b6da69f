"""Data: trajectories (arrays, simulated, or read from files), real benchmark datasets, the
integrity-checked archive format, and a restricted reader of PyTorch files.

    Trajectories, simulate                 observations, inputs, sample time; simulated data
    read_trajectories, read_table          Trajectories from CSV / Parquet / npz files, validated
    load_cascaded_tanks, load_silverbox    real benchmarks with their official splits (checksummed)
    BenchmarkSplit, simulation_rms         one split of a benchmark; the benchmarks' error measure
    InputLimitError                        a file or text past a size or nesting limit
    torchfile                              ``torch.save`` files without torch and without running pickled code
"""
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

__all__ = ["BenchmarkSplit", "ChecksumError", "DataFileError", "DatasetNotFoundError", "InputLimitError", "Trajectories",
           "load_cascaded_tanks", "load_silverbox", "read_table", "read_trajectories", "simulate", "simulation_rms",
           "torchfile"]
