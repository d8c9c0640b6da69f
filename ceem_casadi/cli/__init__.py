"""Command line interface ``ceem-casadi`` (see ``ceem-casadi --help`` and docs/usage_cli.md)."""
from ._main import main

__all__ = ["main"]
