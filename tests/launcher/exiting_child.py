"""A child process for the supervisor's tests: sleeps ``--seconds``, then exits with ``--status``."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from services.common.settings import option


@dataclass(frozen=True)
class ExitingSettings:
    """How long the child lives and how it ends."""

    seconds: float = option(0.0, "Seconds to live.")
    status: int = option(3, "Exit status.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--status", type=int, default=3)
    args = parser.parse_args()
    time.sleep(args.seconds)
    sys.exit(args.status)
