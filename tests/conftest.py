from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.nats import running_nats


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """A real nats-server shared by the test session."""
    with running_nats() as url:
        yield url
