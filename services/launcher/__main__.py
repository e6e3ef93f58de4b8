"""``python -m services.launcher`` is the ``harnessmesh`` command."""

import sys

from services.launcher.cli import main

sys.exit(main())
