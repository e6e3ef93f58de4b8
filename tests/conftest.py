from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import structlog

from tests.support.nats import running_nats

# Log lines of in-process servers go to stderr, as in the real processes (services/common/logging.py), so a
# test reading a command's stdout (capsys) reads only what the command printed.
structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """A real nats-server shared by the test session."""
    with running_nats() as url:
        yield url
