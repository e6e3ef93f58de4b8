"""Connecting to NATS: bounded at start-up, unbounded reconnects afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats
import structlog

from services.common.errors import UnavailableError
from services.common.tls import PLAINTEXT, TlsFiles

log = structlog.get_logger()

STARTUP_TIMEOUT = 30.0


async def connect_nats(url: str, name: str, timeout: float = STARTUP_TIMEOUT, *, token: str = "",
                       tls: TlsFiles = PLAINTEXT) -> Any:
    """A NATS connection that reconnects forever once up, but gives up on the first connect after ``timeout``.

    nats-py retries an initial connect forever when reconnects are unbounded, so a wrong ``--nats-url``
    would otherwise hang the process at start-up; this raises :class:`UnavailableError` naming the URL.
    ``url`` may list several servers of one cluster, comma-separated: the connection takes any of them and
    moves to another when its server goes.
    """

    async def on_error(exc: Exception) -> None:  # one line, not nats-py's default traceback per attempt
        log.warning("nats.error", url=url, error=f"{type(exc).__name__}: {exc}")

    async def on_disconnected() -> None:
        log.warning("nats.disconnected", url=url)

    async def on_reconnected() -> None:
        log.info("nats.reconnected", url=url)

    servers = [part.strip() for part in url.split(",") if part.strip()]
    attempt = asyncio.ensure_future(nats.connect(
        servers, name=name, token=token or None, tls=tls.client_context() if tls.enabled else None,
        connect_timeout=2, reconnect_time_wait=0.5, max_reconnect_attempts=-1,
        error_cb=on_error, disconnected_cb=on_disconnected, reconnected_cb=on_reconnected,
    ))
    try:
        return await asyncio.wait_for(asyncio.shield(attempt), timeout)
    except TimeoutError:
        attempt.cancel()
        with contextlib.suppress(BaseException):
            await attempt
        raise UnavailableError(f"cannot reach NATS at {url} within {timeout:.0f}s (is nats-server running?)") from None


async def close_nats(nc: Any, timeout: float = 2.0) -> None:
    """Flush and close ``nc`` at shutdown whatever state NATS is in (a nats-server stopped first, in any
    signal order): drain when connected, else close; never raises."""
    try:
        if nc.is_connected:
            await asyncio.wait_for(nc.drain(), timeout)
            return
    except Exception as exc:  # reconnecting, closed, timed out: closing is all that is left to do
        log.info("nats.drain_skipped", reason=f"{type(exc).__name__}: {exc}")
    with contextlib.suppress(Exception):
        await nc.close()
