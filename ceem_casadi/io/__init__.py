"""File input: trajectory tables and arrays; a restricted reader of PyTorch files.

    read_trajectories, DataFileError     Trajectories from CSV / Parquet / npz files, validated
    InputLimitError                      a file or text past a size or nesting limit (io._limits)
    read_table                           a CSV / Parquet table as a pandas DataFrame
    torchfile                            ``torch.save`` files without torch and without running pickled code
                                         (the helicopter converter, ``scripts/heli_convert.py``)
"""
from . import torchfile
from ._limits import InputLimitError
from ._readers import DataFileError, read_table, read_trajectories

__all__ = ["DataFileError", "InputLimitError", "read_table", "read_trajectories", "torchfile"]
