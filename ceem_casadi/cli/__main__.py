"""``python -m ceem_casadi.cli``: the ``ceem-casadi`` command, with the working directory removed from the
import path first (a ``pandas.py`` there must not run)."""
import sys

from ._main import drop_working_directory, main

drop_working_directory()
sys.exit(main())
