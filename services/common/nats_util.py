"""Connecting to NATS: bounded at start-up, unbounded reconnects afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats

from services.common.errors import UnavailableError

STARTUP_TIMEOUT = 30.0


async def connect_nats(url: str, name: str, timeout: float = STARTUP_TIMEOUT) -> Any:
    """A NATS connection that reconnects forever once up, but gives up on the first connect after ``timeout``.

    nats-py retries an initial connect forever when reconnects are unbounded, so a wrong ``--nats-url``
    would otherwise hang the process at start-up; this raises :class:`UnavailableError` naming the URL.
    """
    attempt = asyncio.ensure_future(
        nats.connect(url, name=name, connect_timeout=2, reconnect_time_wait=0.5, max_reconnect_attempts=-1)
    )
    try:
        return await asyncio.wait_for(asyncio.shield(attempt), timeout)
    except TimeoutError:
        attempt.cancel()
        with contextlib.suppress(BaseException):
            await attempt
        raise UnavailableError(f"cannot reach NATS at {url} within {timeout:.0f}s (is nats-server running?)") from None
