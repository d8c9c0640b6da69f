"""``python -m ceem_casadi.cli``: the ``ceem-casadi`` command.

``python -m`` puts the working directory first on the import path; it is removed here before any
command imports pandas or matplotlib, so a ``pandas.py`` in the directory is not run (the console
script ``ceem-casadi`` never has it on the path). Modules the interpreter imported before this
line (``ceem_casadi`` itself, numpy, casadi) are already loaded.
"""
import sys

from ._main import drop_working_directory, main

drop_working_directory()
sys.exit(main())
