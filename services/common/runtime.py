"""Process entry helpers: uvloop, signal handling, one structured start-up event."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from services.common.errors import MeshError
from services.common.logging import configure_logging
from services.common.settings import as_log_dict


def run_service(service: str, settings: Any, serve: Callable[[Any, asyncio.Event], Awaitable[None]]) -> None:
    """Configure logging, log the settings once, and run ``serve(settings, stop)`` until SIGINT/SIGTERM.

    ``serve`` must return soon after ``stop`` is set; it owns all its resources. A :class:`MeshError`
    or ``OSError`` escaping it (a bad model directory, a port in use, an unreachable NATS) ends the
    process with status 1 and one ``<service>.start_failed`` line naming the cause, not a traceback.
    """
    configure_logging(service, getattr(settings, "log_level", "info"), getattr(settings, "log_format", "json"))
    structlog.get_logger().info(f"{service}.settings", **as_log_dict(settings))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    _tune_gc()
    try:
        import uvloop

        runner: Callable[[Any], Any] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        runner = asyncio.run
    try:
        with contextlib.suppress(KeyboardInterrupt):
            runner(main())
    except (MeshError, OSError) as exc:
        message = exc.message if isinstance(exc, MeshError) else f"{type(exc).__name__}: {exc}"
        structlog.get_logger().error(f"{service}.start_failed", error=message)
        sys.exit(1)


# Young-generation collections every 20k net allocations instead of 700: a streaming request allocates
# thousands of short-lived containers, and each older-generation pass walks every long-lived object
# (the router's KV index, the parse service's tokenizer), which cost the router ~6% of its CPU.
GC_THRESHOLDS = (20_000, 20, 20)


# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). A large request's
# conversion and render run in a worker thread (gateway, parse); the event loop then waits up to this long
# for the GIL at every turn, and one answer takes several turns. 1 ms against 5, slowest /ready (gateway and
# parse loops) while 9,999-message requests ran (bench/loop_stall.py's probe): 63 ms against 102, typically
# ~50 against ~75. No thread waits, no effect.
SWITCH_INTERVAL = 0.001


def _tune_gc() -> None:
    """Move what start-up imported out of the collector's sight and collect less often (see GC_THRESHOLDS);
    let the event loop have the GIL back sooner from a busy worker thread (see SWITCH_INTERVAL)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL)
