"""``python -m ceem_casadi.cli``: the ``ceem-casadi`` command."""
import sys

from ._main import main

sys.exit(main())
