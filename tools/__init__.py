"""Tools that drive real rmpd daemons from outside: run from the repository (``scripts/``, the tests), never
installed with the ``rmpd`` package."""
