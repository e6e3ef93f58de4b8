"""Process entry helpers: uvloop, signal handling, one structured start-up event."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
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
    tune_malloc()
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


# glibc's malloc hands a block of 128 KB or more out as a fresh mmap (the threshold then follows the largest block
# freed) and gives the top of its heap back to the kernel past 128 KB free, so a long session's turn, whose prompt
# (400 KB per 100k tokens), request body and their copies are each a little larger than the last turn's, lands
# in fresh pages every turn: a page fault per 4 KB, ~4 us each on this VM. With blocks below 8 MB served from the
# heap and up to 32 MB of free heap kept, the next turn reuses the last one's pages. Successive 100k-token turns
# (perf stat per process, 5 alternating pairs of meshes, three times): page faults per turn ~172 -> ~100 (the
# gateway's 73 -> ~5: its JSON body's strings), TTFT p50 -7 % (paired median, each time). A scripted turn that
# grows a 400 KB buffer and copies it: 129 -> 3 faults per turn (tests/test_runtime_tuning.py).
MALLOC_MMAP_THRESHOLD = 8 << 20
MALLOC_TRIM_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc malloc's mmap and trim thresholds (see MALLOC_MMAP_THRESHOLD); True when set. Not on another C
    library, nor when the operator set malloc's own (``GLIBC_TUNABLES=glibc.malloc...``, ``MALLOC_*_``)."""
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", "") or any(
            name.startswith("MALLOC_") and name.endswith("_") for name in environ):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's own symbol: musl and others have a mallopt too
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                     MALLOC_TRIM_THRESHOLD))


def _tune_gc() -> None:
    """Move what start-up imported out of the collector's sight and collect less often (see GC_THRESHOLDS);
    let the event loop have the GIL back sooner from a busy worker thread (see SWITCH_INTERVAL)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL)
