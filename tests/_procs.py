"""Processes seen through /proc (no psutil): the children of a pid and whether a pid still runs.
Shared by the process tests (test_workers, test_process_layer, test_compile_pool)."""
from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as dead)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
