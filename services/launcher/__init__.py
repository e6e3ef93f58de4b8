"""``harnessmesh``: the command line, and ``harnessmesh up``, which runs the whole mesh without Docker."""
