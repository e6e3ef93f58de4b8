"""Process-wide logging set-up."""

from __future__ import annotations

import logging

import pytest

from services.common.logging import configure_logging


def test_benign_detach_errors_of_cancelled_streams_are_filtered(caplog: pytest.LogCaptureFixture) -> None:
    configure_logging("test")
    logger = logging.getLogger("opentelemetry.context")
    try:
        raise ValueError("<Token var=<ContextVar name='current_context'> at 0x1> was created in a different Context")
    except ValueError:
        logger.exception("Failed to detach context")
    try:
        raise ValueError("something else")
    except ValueError:
        logger.exception("Failed to detach context")
    kept = [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
    assert kept == ["something else"]
